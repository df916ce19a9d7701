"""xPos (Sun et al. 2023) checked against the official torchscale code."""

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
from attention_jax.lab.config import facts
from configs import copy as copy_config

# ---------------------------------------------------------------------------
# The official code, transcribed line by line from github.com/microsoft/torchscale,
# torchscale/component/xpos_relative_position.py (last changed in
# 9d968a24ed730b1263bbedd1a0074fce321ac1c7) and the xPos lines of
# `MultiheadAttention.forward` in torchscale/component/multihead_attention.py
# (at 4d1e0e82e5adf86dd424f1463192635b73fc8efc). torch -> NumPy, float32
# as torch's defaults are. x is `[B * H, T, D]` there; pairs are interleaved.
# ---------------------------------------------------------------------------


def _official_fixed_pos_embedding(x):
  seq_len, dim = x.shape
  inv_freq = np.float32(1.0) / (np.float32(10000) ** (np.arange(0, dim, dtype=np.float32)
                                                      / np.float32(dim)))
  sinusoid_inp = np.einsum('i , j -> i j', np.arange(0, seq_len, dtype=np.float32),
                           inv_freq).astype(x.dtype)
  return np.sin(sinusoid_inp), np.cos(sinusoid_inp)


def _official_rotate_every_two(x):
  x1 = x[:, :, ::2]
  x2 = x[:, :, 1::2]
  x = np.stack((-x2, x1), axis=-1)
  return x.reshape(*x.shape[:-2], -1)  # in einsum notation: rearrange(x, '... d j -> ... (d j)')


def _official_duplicate_interleave(m):
  dim0 = m.shape[0]
  m = m.reshape(-1, 1)  # flatten the matrix
  m = np.tile(m, (1, 2))  # repeat all elements into the 2nd dimension
  return m.reshape(dim0, -1)  # reshape into a matrix, interleaving the copy


def _official_apply_rotary_pos_emb(x, sin, cos, scale=1):
  sin, cos = map(lambda t: _official_duplicate_interleave(t * scale), (sin, cos))
  return (x * cos) + (_official_rotate_every_two(x) * sin)


class _OfficialXPOS:

  def __init__(self, head_dim, scale_base=512):
    self.head_dim = head_dim
    self.scale_base = scale_base
    self.scale = ((np.arange(0, head_dim, 2).astype(np.float32) + np.float32(0.4 * head_dim))
                  / np.float32(1.4 * head_dim))

  def forward(self, x, offset=0, downscale=False):
    length = x.shape[1]
    min_pos = -(length + offset) // 2
    max_pos = length + offset + min_pos
    scale = self.scale ** (np.arange(min_pos, max_pos, 1).astype(np.float32)
                           / np.float32(self.scale_base))[:, None]
    sin, cos = _official_fixed_pos_embedding(scale)

    if scale.shape[0] > length:
      scale = scale[-length:]
      sin = sin[-length:]
      cos = cos[-length:]

    if downscale:
      scale = 1 / scale

    return _official_apply_rotary_pos_emb(x, sin, cos, scale)


def _official_scores(xpos, q, k):
  """Full pass (`incremental_state` None): offset 0 for both; `[BH, T, T]`.
  (`q *= self.scaling` is left out: a constant, and ours is unscaled too.)"""
  k = xpos.forward(k, offset=0, downscale=True)
  q = xpos.forward(q, offset=0, downscale=False)
  return q @ k.transpose(0, 2, 1)


def _official_cached_scores(xpos, q, k):
  """Incremental decoding, one token per step: the cache holds the keys
  *before* xPos and all of them are re-scaled each step (offset 0), the new
  query gets `offset = src_len - 1`. Row t: `[BH, 1, t + 1]`."""
  rows = []
  for t in range(q.shape[1]):
    src_len = t + 1
    keys = xpos.forward(k[:, :src_len], offset=0, downscale=True)
    query = xpos.forward(q[:, t:t + 1], offset=src_len - 1, downscale=False)
    rows.append(query @ keys.transpose(0, 2, 1))
  return rows


# ---------------------------------------------------------------------------


def _interleave(head_dim):
  """π: split-halves features -> the official interleaved order,
  π[2i] = i, π[2i + 1] = i + D/2, so that ours(x)[..., π] = official(x[..., π])."""
  half = head_dim // 2
  return np.stack([np.arange(half), np.arange(half) + half], -1).reshape(-1)


def _to_official(x, perm):
  """Ours `[B, T, H, D]` -> official `[B * H, T, D]`, features in the interleaved order."""
  b, t, h, d = x.shape
  return np.asarray(x, np.float32)[..., perm].transpose(0, 2, 1, 3).reshape(b * h, t, d)


def _qk(head_dim, length=10, batch=2, heads=2, dtype=jnp.float32, seed=0):
  rng = np.random.default_rng(seed)  # NumPy: no compile per shape
  q, k = rng.standard_normal((2, batch, length, heads, head_dim), np.float32)
  return jnp.asarray(q, dtype), jnp.asarray(k, dtype)


def _rotate(enc, q, k, q_positions, k_positions):
  """`enc.rotate_queries_keys` as one compiled call (positions traced, so
  the static range check is not exercised here)."""
  return jax.jit(enc.rotate_queries_keys)(q, k, q_positions, k_positions)


def _scores(q, k):
  return jnp.einsum('bthd,bshd->bhts', q, k, precision='highest')


class XPosMatchesTheOfficialCodeTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('xpos_8_even', 8, 10, 512.0), ('xpos_16_odd', 16, 7, 512.0),
                                  ('xpos_8_short_gamma', 8, 9, 4.0))
  def test_xpos_q_k_match_official_with_its_centre(self, head_dim, length, scale_base):
    """With centre = the official full pass's ⌈T/2⌉, q and k themselves agree
    after the interleaving permutation."""
    centre = -(-length // 2)  # official min_pos = -(T) // 2 = -⌈T/2⌉
    enc = pe.XPos(head_dim, scale_base=scale_base, centre=centre)
    q, k = _qk(head_dim, length)
    got_q, got_k = _rotate(enc, q, k, np.arange(length), np.arange(length))
    perm = _interleave(head_dim)
    xpos = _OfficialXPOS(head_dim, scale_base)
    np.testing.assert_allclose(_to_official(got_q, perm),
                               xpos.forward(_to_official(q, perm), downscale=False),
                               rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(_to_official(got_k, perm),
                               xpos.forward(_to_official(k, perm), downscale=True),
                               rtol=2e-5, atol=2e-5)

  @parameterized.named_parameters(('xpos_default_centre', 0), ('xpos_far_centre', -300))
  def test_xpos_scores_match_official_full_and_cached(self, centre):
    """Our fixed centre gives the official scores, of its full pass and of its
    step-by-step decoding (moving centre, re-scaled keys), on m >= n."""
    head_dim, length = 8, 10
    enc = pe.XPos(head_dim, scale_base=8.0, centre=centre)  # short γ: a visible decay
    q, k = _qk(head_dim, length, seed=1)
    ours = np.asarray(_scores(*_rotate(enc, q, k, np.arange(length), np.arange(length))))
    ours = ours.reshape(-1, length, length)  # [B * H, T, T], as the official's
    perm = _interleave(head_dim)
    xpos = _OfficialXPOS(head_dim, 8.0)
    oq, ok = _to_official(q, perm), _to_official(k, perm)
    causal = np.tril(np.ones((length, length), bool))
    np.testing.assert_allclose(ours[:, causal], _official_scores(xpos, oq, ok)[:, causal],
                               rtol=1e-5, atol=1e-5)
    for t, row in enumerate(_official_cached_scores(xpos, oq, ok)):
      np.testing.assert_allclose(ours[:, t, :t + 1], row[:, 0], rtol=1e-5, atol=1e-5)
    rope = pe.RoPE(head_dim)  # the test sees the decay: xPos is not RoPE here
    plain = np.asarray(_scores(*_rotate(rope, q, k, np.arange(length), np.arange(length))))
    self.assertGreater(np.abs(ours - plain.reshape(ours.shape))[:, causal].max(), 0.1)


class XPosPropertiesTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('xpos_centre_0', 0), ('xpos_centre_7', 7),
                                  ('xpos_centre_neg', -300))
  def test_xpos_score_is_rope_times_zeta_power_of_distance(self, centre):
    """Pair i of q'_m·k'_n is RoPE's pair-i score × ζ_i^((m - n)/γ), with
    ζ_i = (2i/D + 0.4)/1.4 (written here from the formula): the centre cancels."""
    d, gamma, t = 8, 16.0, 9
    q, k = _qk(d, t, seed=2)
    positions = np.arange(t)
    xq, xk = _rotate(pe.XPos(d, scale_base=gamma, centre=centre), q, k, positions, positions)
    rq, rk = (np.asarray(a, np.float64) for a in _rotate(pe.RoPE(d), q, k, positions, positions))
    per_pair = (np.einsum('bthi,bshi->bhtsi', rq[..., :d // 2], rk[..., :d // 2])
                + np.einsum('bthi,bshi->bhtsi', rq[..., d // 2:], rk[..., d // 2:]))
    zeta = (2 * np.arange(d // 2) / d + 0.4) / 1.4
    distance = positions[:, None] - positions[None, :]
    want = (per_pair * zeta ** (distance[..., None] / gamma)).sum(-1)
    np.testing.assert_allclose(np.asarray(_scores(xq, xk)), want, rtol=1e-5, atol=1e-5)

  @parameterized.named_parameters(('xpos_shift_37', 37), ('xpos_shift_1000', 1000),
                                  ('xpos_shift_neg', -500))
  def test_xpos_scores_depend_only_on_m_minus_n(self, shift):
    enc = pe.XPos(8, scale_base=64.0)
    q, k = _qk(8, 10, seed=3)
    p = np.arange(10)
    base = _scores(*_rotate(enc, q, k, p, p))
    shifted = _scores(*_rotate(enc, q, k, p + shift, p + shift))
    np.testing.assert_allclose(shifted, base, rtol=1e-5, atol=1e-5)

  def test_xpos_cached_keys_equal_the_full_pass_bit_for_bit(self):
    """A key's rotation and scale depend on its own position only (fixed
    centre), so decoding one token at a time reproduces the full pass exactly."""
    enc = pe.XPos(8, scale_base=32.0, centre=3)
    q, k = _qk(8, 10, seed=4)
    rotate = jax.jit(enc.rotate_queries_keys)
    full_q, full_k = rotate(q, k, jnp.arange(10)[None], jnp.arange(10)[None])
    for i in range(10):
      step_q, step_k = rotate(q[:, i:i + 1], k[:, i:i + 1], jnp.full((1, 1), i, jnp.int32),
                              jnp.full((1, 1), i, jnp.int32))
      np.testing.assert_array_equal(step_q[:, 0], full_q[:, i])
      np.testing.assert_array_equal(step_k[:, 0], full_k[:, i])

  @parameterized.named_parameters(('xpos_f32', jnp.float32), ('xpos_bf16', jnp.bfloat16))
  def test_xpos_dtype_is_kept_and_computed_in_f32(self, dtype):
    enc = pe.XPos(8, scale_base=16.0)
    q, k = _qk(8, 10, dtype=dtype, seed=5)
    p = np.arange(10) * 3
    got_q, got_k = _rotate(enc, q, k, p, p)
    want_q, want_k = _rotate(enc, q.astype(jnp.float32), k.astype(jnp.float32), p, p)
    self.assertEqual((got_q.dtype, got_k.dtype), (dtype, dtype))
    np.testing.assert_array_equal(np.asarray(got_q, np.float32),
                                  np.asarray(want_q.astype(dtype), np.float32))
    np.testing.assert_array_equal(np.asarray(got_k, np.float32),
                                  np.asarray(want_k.astype(dtype), np.float32))

  def test_xpos_position_limit(self):
    """|p - c| <= B ln 2 γ / ln(7/2): 17,847 for float32 (B = 63), 1,983 for
    float16 (B = 7), at γ = 512; the scales at the limit are within 2^±B."""
    self.assertEqual(math.floor(63 * math.log(2) * 512 / math.log(3.5)), 17847)
    enc = pe.XPos(8)
    self.assertEqual(enc.position_limit(jnp.float32), 17847)
    self.assertEqual(enc.position_limit(jnp.bfloat16), 17847)
    self.assertEqual(enc.position_limit(jnp.float16), 1983)
    self.assertEqual(pe.xpos_position_limit(64, 512.0), 17847)  # ζ_0 = 2/7 for any D
    # A rotation keeps the norm of each pair: pair 0's norm ratio is its scale.
    x = jnp.ones((1, 2, 1, 8), jnp.float32)
    limit = 17847
    ends = np.array([-limit, limit])  # static (a constant of the graph): checked
    q, k = jax.jit(lambda a: enc.rotate_queries_keys(a, a, ends, ends))(x)
    norm0 = lambda a: np.hypot(np.asarray(a)[0, :, 0, 0], np.asarray(a)[0, :, 0, 4]) / math.sqrt(2)
    scales = np.concatenate([norm0(q), norm0(k)])  # q: 2^63, 2^-63 … ; k the inverse
    self.assertTrue(np.all(np.isfinite(scales)))
    self.assertLessEqual(np.log2(scales).max(), 63.0 + 1e-4)
    self.assertGreater(np.log2(scales).max(), 62.9)
    self.assertGreaterEqual(np.log2(scales).min(), -63.0 - 1e-4)

  @parameterized.named_parameters(
      ('xpos_query_high', np.array([0, 17848]), np.array([0, 1]), 'query positions range over '
       r'\[0, 17848\] but with centre=0 .* -17847 … 17847'),
      ('xpos_key_low', np.array([0, 1]), np.array([-17848, 0]), r'key positions range over'),
      ('xpos_centre_moves_it', np.array([20000]), np.array([20000]), None))
  def test_xpos_static_positions_out_of_range_are_refused(self, qp, kp, message):
    enc = pe.XPos(8, centre=20000 if message is None else 0)
    q, k = _qk(8, len(qp))
    k = k[:, :len(kp)]
    rotate = jax.jit(lambda q, k: enc.rotate_queries_keys(q, k, qp, kp))  # static positions
    if message is None:
      self.assertTrue(np.all(np.isfinite(np.asarray(rotate(q, k)[0]))))
      return
    with self.assertRaisesRegex(ValueError, message):
      rotate(q, k)

  @parameterized.named_parameters(
      ('xpos_causal', dict(causal=False), r'xpos: causal=False is not supported'),
      ('xpos_scale_base_zero', dict(scale_base=0), r'xpos: scale_base=0 must be a finite '
                                                   r'number > 0'),
      ('xpos_scale_base_inf', dict(scale_base=math.inf), r'xpos: scale_base=inf must be'),
      ('xpos_base', dict(base=0.5), r'xpos: base=0\.5 must be a number > 1'),
      ('xpos_centre_float', dict(centre=1.5), r'xpos: centre=1\.5 must be an integer'),
      ('xpos_centre_bool', dict(centre=True), r'xpos: centre=True must be an integer'),
      ('xpos_head_dim', dict(d_model=6), r'xpos: head_dim=3 \(d_model // num_heads\) must be '
                                         'even'),
      ('xpos_unknown', dict(gamma=512), r"'xpos' got an unknown option among \['gamma'\]"))
  def test_xpos_bad_options_name_the_key(self, options, message):
    kw = dict(d_model=16, num_heads=2)
    kw.update(options)
    with self.assertRaisesRegex(ValueError, message):
      pe.make_encoding('xpos', **kw)

  def test_xpos_bidirectional_modules_refuse_it(self):
    with self.assertRaisesRegex(ValueError, r'xpos: causal=False is not supported'):
      aj.MultiHeadAttention(16, 2, encoding='xpos', causal=False, rngs=nnx.Rngs(0))
    built = pe.make_encoding('xpos', d_model=16, num_heads=2)
    with self.assertRaisesRegex(ValueError, r'XPos was built with causal=True'):
      aj.MultiHeadAttention(16, 2, encoding=built, causal=False, rngs=nnx.Rngs(0))

  def test_xpos_config_group_is_the_default_encoding(self):
    options = facts.encoding_options(copy_config.get_config('encoding=xpos'))  # build's defaults
    self.assertEqual(dict(options), dict(base=10000.0, scale_base=512.0, centre=0))
    enc = pe.make_encoding('xpos', d_model=64, num_heads=4, **options)
    self.assertEqual((enc.base, enc.scale_base, enc.centre, enc.head_dim),
                     (10000.0, 512.0, 0, 16))


if __name__ == '__main__':
  absltest.main()
