"""FIRE (Li et al. 2024) checked against the reference port's forward.

There is no official repository; the reference is the port in
github.com/mcleish7/arithmetic, cramming/architectures/embeddings.py, class
`FIRE` (commit 55af9d5e3d9b2265ae7638b4f2936c9a70538cc4), transcribed line by
line below (torch -> NumPy, float32 as torch's default dtype).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax import positional as pe
from attention_jax.lab.config import validate
from attention_jax.lab.config.facts import resolve_options  # the lab's options, defaults filled
from configs import copy as copy_config

# ---------------------------------------------------------------------------
# The port's `FIRE.forward(seq_length, device)`, split in two: the positions
# it draws, and the bias at those positions. Parameters in torch's layout:
# Linear weights `[out, in]`.
# ---------------------------------------------------------------------------


def _official_positions(seq_length, max_length, training, rng):
  """The first half of `forward`: contiguous, or (training with max_length >
  seq_length) a sorted subset of a random permutation of 0 … max_length-1."""
  if (seq_length > max_length) or (not training):
    max_length = seq_length
  positions = np.sort(rng.permutation(max_length).astype(np.float32)[:seq_length])
  return positions


def _official_fire_bias(p, positions):
  """The rest of `forward`: `[1, num_heads, T, T]`."""
  f32 = np.float32
  relative_distances = positions[:, None] - positions[None, :]

  # Thresholding the normalizer for short sequence modeling
  threshold = np.abs(f32(p['L_multiplier']) * f32(p['init_L']))
  position_normalizer = np.maximum(positions, threshold)[:, None]

  # Amplifying differences among local positions with log transform
  relative_distances = np.log(np.abs(f32(p['c']) * relative_distances) + 1)
  position_normalizer = np.log(np.abs(f32(p['c']) * position_normalizer) + 1)

  # Progressive interpolation
  normalized_distances = relative_distances / (position_normalizer + f32(p['eps']))
  x = normalized_distances[..., None]  # unsqueeze(-1)
  # self.mlp: Linear(1, W), ReLU, Linear(W, H)
  h = np.maximum(x @ p['mlp.0.weight'].T + p['mlp.0.bias'], 0)
  fire_bias = (h @ p['mlp.2.weight'].T + p['mlp.2.bias'])[None]
  fire_bias = fire_bias.transpose(0, 3, 1, 2)  # permute(0, 3, 1, 2)
  return fire_bias


def _official_forward(p, seq_length, max_length=0, training=False, rng=None):
  rng = rng or np.random.default_rng(0)
  return _official_fire_bias(p, _official_positions(seq_length, max_length, training, rng))


# ---------------------------------------------------------------------------


def _official_params(num_heads, width, seed, c=0.1, init_L=512.0, L_multiplier=1.0, eps=1e-6):
  rng = np.random.default_rng(seed)
  normal = lambda *shape: rng.normal(size=shape).astype(np.float32)
  return {'mlp.0.weight': normal(width, 1), 'mlp.0.bias': normal(width),
          'mlp.2.weight': normal(num_heads, width) / np.sqrt(width),
          'mlp.2.bias': normal(num_heads), 'c': c, 'init_L': init_L,
          'L_multiplier': L_multiplier, 'eps': eps}


def _copy_into(enc, p):
  """The port's parameters into our module (kernels `[in, out]`)."""
  enc.w1[...] = jnp.asarray(p['mlp.0.weight'].T)
  enc.b1[...] = jnp.asarray(p['mlp.0.bias'])
  enc.w2[...] = jnp.asarray(p['mlp.2.weight'].T)
  enc.b2[...] = jnp.asarray(p['mlp.2.bias'])
  enc.c[...] = jnp.float32(p['c'])
  enc.threshold_scale[...] = jnp.float32(p['L_multiplier'])
  enc.init_threshold = float(p['init_L'])


def _fire(num_heads=3, **options):
  return pe.make_encoding('fire', d_model=4 * num_heads, num_heads=num_heads,
                          rngs=nnx.Rngs(0), **options)


class FireMatchesTheReferenceTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      # The default threshold: every query below L, a function of i − j alone.
      ('fire_defaults', dict()),
      # L = |−0.5 · 8| = 4 < T: rows past 4 are normalised by ψ(i), and the
      # |·| of a negative multiplier and of a negative c are exercised.
      ('fire_small_threshold', dict(c=-0.3, init_L=8.0, L_multiplier=-0.5)),
      # A large eps, so that where it is added shows.
      ('fire_large_c_and_eps', dict(c=2.5, init_L=3.0, L_multiplier=1.3, eps=0.5)))
  def test_fire_contiguous_positions(self, params):
    p = _official_params(3, 5, seed=1, **params)
    enc = _fire(3, mlp_width=5, eps=p['eps'])
    _copy_into(enc, p)
    want = _official_forward(p, 13)
    got = jax.jit(lambda e: e.attention_bias(np.arange(13), np.arange(13)))(enc)
    self.assertEqual(got.dtype, jnp.float32)
    chex.assert_shape(got, (1, 3, 13, 13))
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6, atol=2e-6)
    # Keys after the query (i − j < 0, masked in a causal model) are finite,
    # in the reference (its |·|) and here; and the bias does depend on j.
    self.assertTrue(np.isfinite(np.asarray(got)).all())
    self.assertGreater(np.abs(want[0, :, 0, 1:] - want[0, :, 0, :1]).max(), 1e-3)

  def test_fire_randomized_positions_and_batches(self):
    """The port's training branch (sorted random positions) = our bias at those
    positions; batched positions give each row's bias."""
    p = _official_params(2, 4, seed=2, c=0.7, init_L=20.0, L_multiplier=1.0)
    enc = _fire(2, mlp_width=4)
    _copy_into(enc, p)
    rows = [_official_positions(9, 64, True, np.random.default_rng(s)) for s in (3, 4)]
    self.assertGreater(max(r.max() for r in rows), 20)  # some queries past L
    positions = np.stack(rows).astype(np.int32)  # [2, 9]
    got = np.asarray(enc.attention_bias(positions, positions))
    chex.assert_shape(got, (2, 2, 9, 9))
    for b, seed in enumerate((3, 4)):
      want = _official_forward(p, 9, max_length=64, training=True,
                               rng=np.random.default_rng(seed))
      np.testing.assert_allclose(got[b], want[0], rtol=2e-6, atol=2e-6)

  def test_fire_pure_function_and_module_agree(self):
    enc = _fire(2, init_threshold=3.0)
    q, k = np.arange(5, 8), np.arange(8)  # a decoding step's queries against a cache
    got = jax.jit(pe.fire_bias)(enc.w1[...], enc.b1[...], enc.w2[...], enc.b2[...],
                                enc.c[...], enc.threshold(), q, k)
    chex.assert_shape(got, (2, 3, 8))
    full = jax.jit(lambda e: e.attention_bias(np.arange(8), np.arange(8)))(enc)[0]
    np.testing.assert_allclose(got, full[:, 5:], rtol=1e-6, atol=1e-6)


class FireDtypesTest(chex.TestCase, parameterized.TestCase):

  def test_fire_bfloat16_model_path(self):
    """bf16 activations: the bias stays float32; outputs finite and close to f32."""
    x = jax.random.normal(jax.random.key(1), (2, 7, 16))
    outs = {}
    for dtype in (jnp.float32, jnp.bfloat16):
      mha = aj.MultiHeadAttention(16, 4, causal=True, encoding='fire', dtype=dtype,
                                  rngs=nnx.Rngs(0))
      out, weights = nnx.jit(lambda m, x: m(x, return_weights=True))(mha, x.astype(dtype))
      self.assertEqual(out.dtype, dtype)
      self.assertEqual(weights.dtype, jnp.float32)
      self.assertEqual(mha.positional.attention_bias(np.arange(7), np.arange(7)).dtype,
                       jnp.float32)
      chex.assert_tree_all_finite((out, weights))
      outs[dtype] = out
    np.testing.assert_allclose(np.asarray(outs[jnp.bfloat16], np.float32),
                               np.asarray(outs[jnp.float32]), atol=5e-2)

  def test_fire_trains_every_parameter(self):
    """c, L's scale and the MLP all get a finite, nonzero gradient (L's scale
    only through the queries at i < L: here L = 3, T = 6)."""
    enc = _fire(2, init_threshold=3.0)
    _, params = nnx.split(enc, nnx.Param)

    def loss(params):
      e = nnx.merge(nnx.graphdef(enc), params)
      return jnp.sum(jnp.tril(e.attention_bias(np.arange(6), np.arange(6))[0]) ** 2)

    grads = jax.jit(jax.grad(loss))(params)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
      chex.assert_tree_all_finite(g)
      self.assertGreater(float(jnp.abs(g).max()), 0.0, msg=str(path))


class FireConfigTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('fire_width_zero', dict(mlp_width=0), r'fire: mlp_width=0 must be an integer >= 1'),
      ('fire_width_float', dict(mlp_width=2.5), r'fire: mlp_width=2.5 must be an integer'),
      ('fire_c', dict(init_c=0.0), r'fire: init_c=0.0 must be a finite number > 0'),
      ('fire_threshold', dict(init_threshold=-1), r'fire: init_threshold=-1 must be'),
      ('fire_eps', dict(eps=float('nan')), r'fire: eps=nan must be a finite number > 0'))
  def test_fire_bad_options_name_the_key(self, options, message):
    with self.assertRaisesRegex(ValueError, message):
      _fire(2, **options)

  def test_fire_unknown_option(self):
    with self.assertRaisesRegex(ValueError, r"'fire' got an unknown option among \['width'\]"):
      _fire(2, width=8)

  def test_fire_lab_config_validates(self):
    config = resolve_options(copy_config.get_config('encoding=fire,scale=tiny'))
    self.assertEqual(config.model.encoding_options.fire.mlp_width, 32)
    validate.validate_config(config)
    validate.validate_config(copy_config.get_config('encoding=fire:randomized,scale=tiny'))
    config.model.encoding_options.fire.width = 8
    with self.assertRaisesRegex(validate.ConfigError,
                                r'model\.encoding_options\.fire\.width: .*mlp_width'):
      validate.validate_config(config)

  def test_fire_config_values_checked_by_the_kernel_check(self):
    config = resolve_options(copy_config.get_config('encoding=fire,scale=tiny'))
    config.model.attention_implementation = 'chunked'
    config.model.encoding_options.fire.mlp_width = 0
    with self.assertRaisesRegex(validate.ConfigError,
                                r'model\.encoding_options\.fire\.mlp_width=0 must be an integer'):
      validate.validate_config(config)
    config.model.encoding_options.fire.mlp_width = 4
    # A dense bias: the chunked kernel refuses it (the 'auto' one falls back to dense).
    with self.assertRaisesRegex(validate.ConfigError, 'not linear in i - j'):
      validate.validate_config(config)


if __name__ == '__main__':
  absltest.main()
