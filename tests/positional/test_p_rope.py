"""p-RoPE (Barbero et al. 2025) checked against the official JAX code."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from attention_jax import positional as pe
from attention_jax.positional.p_rope import rotated_pairs
from attention_jax.lab.config import facts
from configs import copy as copy_config

# ---------------------------------------------------------------------------
# The official code, transcribed line by line from github.com/google-deepmind/gemma,
# gemma/gm/math/_positional_embeddings.py, `apply_rope` with `rope_proportion`
# (file last changed in 74824c9446b929136d604fa9abed27791d63e1be). jnp -> NumPy,
# float32 where jnp's defaults are (x64 off). Pairing: split halves, as ours.
# ---------------------------------------------------------------------------


def _official_apply_rope(inputs, positions, *, base_frequency, scale_factor=1.0,
                         rope_proportion=1.0):
  """inputs `[B, L, N, H]`, positions `[B, L]` -> `[B, L, N, H]`."""
  head_dim = inputs.shape[-1]
  rope_angles = int(rope_proportion * head_dim // 2)
  nope_angles = head_dim // 2 - rope_angles
  freq_exponents = (2.0 / head_dim) * np.arange(0, rope_angles, dtype=np.float32)
  timescale = np.pad(
      np.float32(base_frequency) ** freq_exponents.astype(np.float32),
      (0, nope_angles),
      mode='constant',
      constant_values=(0, np.inf),
  ).astype(np.float32)

  sinusoid_inp = (
      positions[..., np.newaxis].astype(np.float32) / timescale[np.newaxis, np.newaxis, :]
  )
  sinusoid_inp = sinusoid_inp[..., np.newaxis, :]
  if scale_factor < 1.0:
    raise ValueError(f'scale_factor must be >= 1.0, got {scale_factor}')
  sinusoid_inp /= np.float32(scale_factor)

  sin = np.sin(sinusoid_inp)
  cos = np.cos(sinusoid_inp)

  first_half, second_half = np.split(inputs.astype(np.float32), 2, axis=-1)
  first_part = first_half * cos - second_half * sin
  second_part = second_half * cos + first_half * sin
  out = np.concatenate([first_part, second_part], axis=-1)
  return out.astype(inputs.dtype)


def _rotate(enc, q, k, q_positions, k_positions):
  """`enc.rotate_queries_keys` as one compiled call (eager op-by-op dispatch
  would compile every primitive: slow on the 2-core CPU)."""
  return jax.jit(enc.rotate_queries_keys)(q, k, q_positions, k_positions)


def _qk(head_dim, length=12, batch=2, heads=2, dtype=jnp.float32):
  rng = np.random.default_rng(head_dim)  # NumPy: no compile per shape
  q, k = rng.standard_normal((2, batch, length, heads, head_dim), np.float32)
  return jnp.asarray(q, dtype), jnp.asarray(k, dtype)


class PRoPEMatchesTheOfficialCodeTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('p_rope_16_075', 16, 0.75), ('p_rope_16_03', 16, 0.3), ('p_rope_12_025', 12, 0.25),
      ('p_rope_8_05', 8, 0.5), ('p_rope_16_1', 16, 1.0), ('p_rope_16_0', 16, 0.0),
      ('p_rope_100_058', 100, 0.58))  # 0.58 * 100 = 57.99…: the float rounding case
  def test_p_rope_rotated_q_k_match_official(self, head_dim, p):
    enc = pe.make_encoding('p_rope', d_model=2 * head_dim, num_heads=2, p=p, base=500.0)
    q, k = _qk(head_dim)
    positions = np.random.default_rng(2).integers(0, 40, (2, 12), dtype=np.int32)
    got_q, got_k = _rotate(enc, q, k, positions, positions)
    for got, x in ((got_q, q), (got_k, k)):
      want = _official_apply_rope(np.asarray(x), positions, base_frequency=500.0,
                                  rope_proportion=p)
      np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=0)

  @parameterized.named_parameters(('p_rope_100_058', 100, 0.58), ('p_rope_10_07', 10, 0.7),
                                  ('p_rope_16_03', 16, 0.3), ('p_rope_64_01', 64, 0.1))
  def test_p_rope_rounding_is_the_officials(self, head_dim, p):
    """The pairs the official function leaves untouched (at positions > 0) are
    exactly the ones ours leaves untouched, and they are the slowest ones."""
    x = np.random.default_rng(3).standard_normal((1, 3, 1, head_dim), np.float32)
    positions = np.array([[5, 17, 29]])
    official = _official_apply_rope(x, positions, base_frequency=10_000, rope_proportion=p)
    official_kept = np.all(official == x, axis=(0, 1, 2))[:head_dim // 2]
    enc = pe.PRoPE(head_dim, p)
    ours, _ = _rotate(enc, x, x, positions, positions)
    ours_kept = np.all(np.asarray(ours) == x, axis=(0, 1, 2))[:head_dim // 2]
    np.testing.assert_array_equal(ours_kept, official_kept)
    r = rotated_pairs(head_dim, p)
    self.assertEqual(enc.num_rotated, r)
    np.testing.assert_array_equal(ours_kept, np.arange(head_dim // 2) >= r)
    if (head_dim, p) == (100, 0.58):
      self.assertEqual(r, 28)  # not round(29): the code's float floor division

  def test_p_rope_frequencies_are_ropes_with_the_slowest_dropped(self):
    theta = pe.rope_frequencies(16, 100.0)
    ours = pe.p_rope_frequencies(16, 0.75, 100.0)
    np.testing.assert_array_equal(ours[:6], theta[:6])  # exponents over the full head_dim
    np.testing.assert_array_equal(ours[6:], 0.0)
    self.assertTrue(np.all(np.diff(theta) < 0))  # so the dropped ones are the lowest


class PRoPELimitsAndDtypesTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('p_rope_f32', jnp.float32), ('p_rope_bf16', jnp.bfloat16))
  def test_p_rope_one_is_rope_and_zero_is_identity(self, dtype):
    q, k = _qk(8, dtype=dtype)
    positions = np.arange(3, 15)
    rope = pe.make_encoding('rope', d_model=16, num_heads=2, base=123.0)
    full = pe.make_encoding('p_rope', d_model=16, num_heads=2, p=1.0, base=123.0)
    for got, want in zip(_rotate(full, q, k, positions, positions),
                         _rotate(rope, q, k, positions, positions)):
      self.assertEqual(got.dtype, dtype)
      np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    none = pe.make_encoding('p_rope', d_model=16, num_heads=2, p=0.0)
    self.assertEqual(none.num_rotated, 0)
    for got, want in zip(_rotate(none, q, k, positions, positions), (q, k)):
      np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))

  def test_p_rope_bf16_is_the_f32_computation_rounded(self):
    """Angles and the rotation in float32 whatever the input dtype."""
    enc = pe.PRoPE(8, 0.5)
    q, k = _qk(8, dtype=jnp.bfloat16)
    positions = np.arange(12) * 37
    got_q, got_k = _rotate(enc, q, k, positions, positions)
    want_q, want_k = _rotate(enc, q.astype(jnp.float32), k.astype(jnp.float32),
                             positions, positions)
    self.assertEqual((got_q.dtype, got_k.dtype), (jnp.bfloat16, jnp.bfloat16))
    np.testing.assert_array_equal(np.asarray(got_q, np.float32),
                                  np.asarray(want_q.astype(jnp.bfloat16), np.float32))
    np.testing.assert_array_equal(np.asarray(got_k, np.float32),
                                  np.asarray(want_k.astype(jnp.bfloat16), np.float32))

  def test_p_rope_scores_depend_on_distance_only(self):
    enc = pe.PRoPE(8, 0.5)
    q, k = _qk(8)
    scores = lambda shift: jnp.einsum('bthd,bshd->bhts', *_rotate(
        enc, q, k, np.arange(12) + shift, np.arange(12) + shift))
    np.testing.assert_allclose(scores(1000), scores(0), atol=2e-5)
    self.assertGreater(float(jnp.abs(scores(0) - jnp.einsum('bthd,bshd->bhts', q, k)).max()),
                       0.1)  # the rotated pairs do change the scores

  @parameterized.named_parameters(
      ('p_rope_p_high', dict(p=1.5), r"p_rope: p=1\.5 must be a number in \[0, 1\]"),
      ('p_rope_p_negative', dict(p=-0.1), r"p_rope: p=-0\.1 must be a number in \[0, 1\]"),
      ('p_rope_p_bool', dict(p=True), r'p_rope: p=True must be a number'),
      ('p_rope_p_str', dict(p='half'), r"p_rope: p='half' must be a number"),
      ('p_rope_base', dict(base=1.0), r'p_rope: base=1\.0 must be a number > 1'),
      ('p_rope_head_dim', dict(d_model=6), r'p_rope: head_dim=3 \(d_model // num_heads\) '
                                           'must be even'),
      ('p_rope_unknown', dict(fraction=0.5), r"'p_rope' got an unknown option among "
                                             r"\['fraction'\]"))
  def test_p_rope_bad_options_name_the_key(self, options, message):
    kw = dict(d_model=16, num_heads=2)
    kw.update(options)
    with self.assertRaisesRegex(ValueError, message):
      pe.make_encoding('p_rope', **kw)

  def test_p_rope_config_group_is_the_default_encoding(self):
    options = facts.encoding_options(copy_config.get_config('encoding=p_rope'))  # build's defaults
    self.assertEqual(dict(options), dict(p=0.75, base=10000.0))
    enc = pe.make_encoding('p_rope', d_model=64, num_heads=4, **options)
    self.assertEqual((enc.p, enc.base, enc.num_rotated), (0.75, 10000.0, 6))  # head_dim 16

if __name__ == '__main__':
  absltest.main()
