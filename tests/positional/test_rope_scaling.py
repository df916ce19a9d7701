"""RoPE context extension checked against the official YaRN code, and
randomized positions drawn per example (ours) or per batch (the official code)."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax import positional as pe
from attention_jax.lab import tasks
from attention_jax.lab.evaluate import rope_scaled
from attention_jax.positional.rope import SCALINGS
from configs import copy as copy_config

# ---------------------------------------------------------------------------
# The official YaRN code, transcribed line by line from
# github.com/jquesnelle/yarn, scaled_rope/LlamaYaRNScaledRotaryEmbedding.py
# (`find_correction_dim`, `find_correction_range`, `linear_ramp_mask`,
# `get_mscale`, `LlamaYaRNScaledRotaryEmbedding.yarn`; Hugging Face
# transformers' `_compute_yarn_parameters` in modeling_rope_utils.py is the
# same computation). torch -> NumPy, float32 where torch's `.float()` is.
# ---------------------------------------------------------------------------


def _official_find_correction_dim(num_rotations, dim, base=10000, max_position_embeddings=2048):
  return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (
      2 * math.log(base))


def _official_find_correction_range(low_rot, high_rot, dim, base=10000,
                                    max_position_embeddings=2048):
  low = math.floor(_official_find_correction_dim(low_rot, dim, base, max_position_embeddings))
  high = math.ceil(_official_find_correction_dim(high_rot, dim, base, max_position_embeddings))
  return max(low, 0), min(high, dim - 1)  # Clamp values just in case


def _official_linear_ramp_mask(min_, max_, dim):
  if min_ == max_:
    max_ += 0.001  # Prevent singularity
  linear_func = (np.arange(dim, dtype=np.float32) - min_) / (max_ - min_)
  ramp_func = np.clip(linear_func, 0, 1)
  return ramp_func


def _official_get_mscale(scale=1):
  if scale <= 1:
    return 1.0
  return 0.1 * math.log(scale) + 1.0


def _official_yarn_inv_freq(dim, base, factor, original_max_position_embeddings,
                            beta_fast=32, beta_slow=1, extrapolation_factor=1):
  """`LlamaYaRNScaledRotaryEmbedding.yarn`: the scaled inverse frequencies."""
  pos_freqs = base ** (np.arange(0, dim, 2).astype(np.float32) / dim)
  inv_freq_extrapolation = 1.0 / pos_freqs
  inv_freq_interpolation = 1.0 / (factor * pos_freqs)
  low, high = _official_find_correction_range(beta_fast, beta_slow, dim, base,
                                              original_max_position_embeddings)
  # Get n-d rotational scaling corrected for extrapolation
  inv_freq_mask = (1 - _official_linear_ramp_mask(low, high, dim // 2).astype(np.float32)
                   ) * extrapolation_factor
  inv_freq = inv_freq_interpolation * (1 - inv_freq_mask) + inv_freq_extrapolation * inv_freq_mask
  return inv_freq


def _official_rotate(x, positions, inv_freq, mscale):
  """The official forward: cos/sin caches of `cat(freqs, freqs)` times mscale,
  applied as `x * cos + rotate_half(x) * sin` (x `[T, H, D]`, positions `[T]`)."""
  freqs = np.einsum('i,j->ij', positions.astype(np.float64), inv_freq.astype(np.float64))
  emb = np.concatenate([freqs, freqs], axis=-1)
  cos, sin = (np.cos(emb) * mscale)[:, None, :], (np.sin(emb) * mscale)[:, None, :]
  x1, x2 = np.split(x, 2, axis=-1)
  rotate_half = np.concatenate([-x2, x1], axis=-1)
  return x * cos + rotate_half * sin


# (head_dim, base, factor s, original length L)
_YARN_CASES = (
    (16, 1e4, 7.2, 18),  # the copy study: L = 18 tokens, evaluated to 130
    (128, 1e4, 4.0, 4096),  # Llama-2-like
    (128, 5e5, 8.0, 8192),  # Llama-3-like base
    (64, 1e4, 8.0, 1000),
    (64, 1e6, 16.0, 32768),
    (32, 1e4, 2.0, 64),
    (8, 100.0, 3.0, 10),
    (16, 1e4, 2.0, 4),  # both correction dims clamp to 0: low == high (+ 0.001)
    (16, 1e4, 4.0, 10 ** 9),  # high clamps to dim - 1 > dim // 2: the ramp never reaches 1
)


class YarnMatchesTheOfficialCodeTest(parameterized.TestCase):

  @parameterized.parameters(*_YARN_CASES)
  def test_frequencies_and_temperature(self, dim, base, s, length):
    ours, mult = pe.scaled_rope_frequencies(dim, base, pe.RopeScaling('yarn', s, length))
    official = _official_yarn_inv_freq(dim, base, s, length)
    np.testing.assert_allclose(ours, official, rtol=1e-6, atol=0)
    self.assertAlmostEqual(mult, _official_get_mscale(s), places=12)

  @parameterized.parameters(0.5, 1.0, 1.5, 7.2, 64.0)
  def test_temperature_is_get_mscale(self, s):
    self.assertAlmostEqual(pe.rope.yarn_temperature(s), _official_get_mscale(s), places=12)

  @parameterized.parameters((16, 7.2, 18), (64, 4.0, 100))
  def test_rotated_queries_and_keys_match_the_official_forward(self, dim, s, length):
    """q and k are each multiplied by mscale (the official cos/sin caches are),
    so the logits by mscale²."""
    rope = pe.RoPE(dim, 10000.0, scaling=pe.RopeScaling('yarn', s, length))
    q = np.asarray(jax.random.normal(jax.random.key(0), (1, 40, 2, dim)))
    k = np.asarray(jax.random.normal(jax.random.key(1), (1, 40, 2, dim)))
    positions = np.arange(40)
    got_q, got_k = rope.rotate_queries_keys(q, k, positions, positions)
    inv_freq, mscale = _official_yarn_inv_freq(dim, 10000.0, s, length), _official_get_mscale(s)
    np.testing.assert_allclose(got_q[0], _official_rotate(q[0], positions, inv_freq, mscale),
                               atol=2e-5)
    np.testing.assert_allclose(got_k[0], _official_rotate(k[0], positions, inv_freq, mscale),
                               atol=2e-5)

  def test_the_documented_difference_from_the_paper_ramp(self):
    """rope.py's docstring: max relative difference 0.81 (copy study, at i = 0
    only) and 0.42 (Llama-like, at i = 34, nonzero on i = 21 … 45)."""

    def difference(dim, s, length):
      official, _ = pe.scaled_rope_frequencies(dim, 1e4, pe.RopeScaling('yarn', s, length))
      paper, _ = pe.scaled_rope_frequencies(dim, 1e4, pe.RopeScaling('yarn_paper', s, length))
      return np.abs(paper - official) / official

    small = difference(16, 7.2, 18)
    self.assertAlmostEqual(small.max(), 0.81, delta=0.005)
    np.testing.assert_array_equal(np.nonzero(small > 1e-12)[0], [0])
    llama = difference(128, 4.0, 4096)
    self.assertAlmostEqual(llama.max(), 0.42, delta=0.005)
    self.assertEqual(int(llama.argmax()), 34)
    np.testing.assert_array_equal(np.nonzero(llama > 1e-12)[0], np.arange(21, 46))


class RopeScalingTest(parameterized.TestCase):

  def test_yarn_paper_ramp_and_temperature(self):
    """'yarn_paper': linear in r = L / wavelength between β_slow = 1 and β_fast = 32."""
    s, length = 8.0, 1000
    plain = pe.rope_frequencies(64)
    yarn, mult = pe.scaled_rope_frequencies(64, 10000.0, pe.RopeScaling('yarn_paper', s, length))
    rotations = length * plain / (2 * np.pi)
    np.testing.assert_allclose(yarn[rotations > 32], plain[rotations > 32])
    np.testing.assert_allclose(yarn[rotations < 1], plain[rotations < 1] / s)
    between = (rotations > 1) & (rotations < 32)
    self.assertTrue(between.any())
    self.assertTrue(np.all((yarn[between] < plain[between]) & (yarn[between] > plain[between] / s)))
    share = (32 - rotations[between]) / 31  # the interpolated share, linear in r
    np.testing.assert_allclose(yarn[between], (1 - share) * plain[between]
                               + share * plain[between] / s, rtol=1e-12)
    self.assertAlmostEqual(mult, 0.1 * math.log(s) + 1)

  def test_yarn_keeps_fast_and_interpolates_slow_frequencies(self):
    plain = pe.rope_frequencies(128)
    yarn, _ = pe.scaled_rope_frequencies(128, 1e4, pe.RopeScaling('yarn', 4.0, 4096))
    np.testing.assert_allclose(yarn[:21], plain[:21])
    np.testing.assert_allclose(yarn[46:], plain[46:] / 4.0)
    self.assertTrue(np.all(np.diff(yarn / plain) <= 0))  # monotone ramp in the index

  def test_rope_scaled_with_yarn_sets_and_restores(self):
    model = aj.TransformerLM(vocab_size=8, d_model=16, num_heads=2, num_layers=2, mlp_dim=16,
                             encoding='rope', max_positions=None, rngs=nnx.Rngs(0))
    tokens = jnp.arange(24)[None] % 8
    plain = model(tokens)
    for method in ('yarn', 'yarn_paper'):
      with rope_scaled(model, pe.RopeScaling(method, 4.0, 6)):
        scaled = model(tokens)
      self.assertGreater(float(jnp.abs(scaled - plain).max()), 1e-3)
      chex.assert_trees_all_close(model(tokens), plain)

  def test_bad_scaling_is_a_clear_error(self):
    self.assertEqual(SCALINGS, ('pi', 'ntk', 'yarn', 'yarn_paper'))
    with self.assertRaisesRegex(ValueError, "choose one of \\('pi', 'ntk', 'yarn', 'yarn_paper'\\)"):
      pe.RopeScaling('linear', 2.0)
    for method in ('yarn', 'yarn_paper'):
      with self.assertRaisesRegex(ValueError, f"'{method}' needs original_length >= 1"):
        pe.RopeScaling(method, 2.0)
    with self.assertRaisesRegex(ValueError, 'YaRN needs 0 < beta_slow < beta_fast'):
      pe.RopeScaling('yarn', 2.0, 16, beta_fast=1.0, beta_slow=32.0)


class RandomizedDrawTest(parameterized.TestCase):

  def test_per_batch_shares_one_sorted_sample(self):
    p = np.asarray(pe.random_positions(jax.random.key(0), 16, 20, 50, draw='per_batch'))
    chex.assert_shape(p, (16, 20))
    self.assertEqual(p.dtype, np.int32)
    np.testing.assert_array_equal(p, np.broadcast_to(p[0], p.shape))  # every row the same
    self.assertTrue(np.all(np.diff(p[0]) > 0))  # sorted and distinct
    self.assertTrue(p.min() >= 0 and p.max() < 50)
    np.testing.assert_array_equal(
        p, pe.random_positions(jax.random.key(0), 16, 20, 50, draw='per_batch'))
    other = np.asarray(pe.random_positions(jax.random.key(1), 16, 20, 50, draw='per_batch'))
    self.assertFalse(np.array_equal(p, other))

  def test_per_batch_covers_the_range_across_batches(self):
    seen = np.concatenate([np.asarray(pe.random_positions(
        jax.random.key(i), 2, 20, 50, draw='per_batch'))[0] for i in range(30)])
    np.testing.assert_array_equal(np.unique(seen), np.arange(50))

  def test_per_example_differs_across_rows_and_is_the_default(self):
    key = jax.random.key(0)
    p = np.asarray(pe.random_positions(key, 16, 20, 50, draw='per_example'))
    np.testing.assert_array_equal(p, pe.random_positions(key, 16, 20, 50))
    self.assertEqual(len({tuple(row) for row in p}), 16)
    self.assertTrue(np.all(np.diff(p, axis=1) > 0))
    self.assertTrue(p.min() >= 0 and p.max() < 50)

  def test_bad_draw_is_a_clear_error(self):
    with self.assertRaisesRegex(ValueError, "draw 'per_token'; choose one of"):
      pe.random_positions(jax.random.key(0), 2, 4, 10, draw='per_token')

  @parameterized.parameters('per_example', 'per_batch')
  def test_train_batch_passes_the_draw_through(self, draw):
    kw = dict(batch_size=4, min_length=1, max_length=5, vocab_size=8)
    task = tasks.get_task('copy')
    plain = tasks.train_batch(task, 0, jnp.int32(3), **kw)
    randomized = tasks.train_batch(task, 0, jnp.int32(3), max_position=40, draw=draw, **kw)
    np.testing.assert_array_equal(plain['inputs'], randomized['inputs'])
    p = np.asarray(randomized['positions'])
    chex.assert_shape(p, plain['inputs'].shape)
    self.assertEqual(draw == 'per_batch', bool(np.all(p == p[:1])))
    default = tasks.train_batch(task, 0, jnp.int32(3), max_position=40, **kw)
    self.assertEqual(draw == 'per_example',
                     bool(np.array_equal(default['positions'], randomized['positions'])))
    jitted = jax.jit(lambda step: tasks.train_batch(task, 0, step, max_position=40, draw=draw,
                                                    **kw))(jnp.int32(3))
    np.testing.assert_array_equal(jitted['positions'], p)

  def test_config_field_and_its_check(self):
    from attention_jax.lab.config.validate import validate_config  # pylint: disable=g-import-not-at-top
    c = copy_config.get_config('encoding=learned:randomized,scale=tiny')
    self.assertEqual(c.positions.draw, 'per_example')
    c.positions.draw = 'per_batch'
    validate_config(c)
    c.positions.draw = 'per_token'
    with self.assertRaisesRegex(ValueError, "positions.draw has 'per_token'; allowed"):
      validate_config(c)


if __name__ == '__main__':
  absltest.main()
