"""DAPE (Zheng et al. 2024) checked against the official forward.

Official code: github.com/chuanyang-Zheng/DAPE,
megatron/model/positional_embeddings.py, classes `ParallelKerpleLog_C`
(pos_emb='kerple_c') and `AliBi_C` ('alibi_c'), commit
5667d281dd849d98f0f5cf10041c40f4031a3d84, called from
megatron/model/transformer.py `ParallelSelfAttention.attention` (scores
baddbmm(q, kᵀ, alpha=1/√D), then the DAPE module, then the masked softmax).
DAPE.py (commit dbe2889fba41acf75b3754efe10ba5b642799d9e, `ParallelKerpleLog_DAPE`,
`AliBi_DAPE`) has the same forwards. Transcribed line by line below (torch ->
NumPy, float32; `nn.Linear` weights `[out, in]`).
"""

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
from attention_jax.lab.config import validate
from attention_jax.lab.config.facts import resolve_options  # the lab's options, defaults filled
from configs import copy as copy_config

# ---------------------------------------------------------------------------
# The official modules' `forward(x)`, x the scaled scores `[b, np, sq, sk]`.
# ---------------------------------------------------------------------------


def _official_mlp2(p, x):
  """self.mlp2: Linear(2H, W), LeakyReLU(), Linear(W, H)."""
  h = x @ p['mlp2.0.weight'].T + p['mlp2.0.bias']
  h = np.where(h >= 0, h, np.float32(0.01) * h)
  return h @ p['mlp2.2.weight'].T + p['mlp2.2.bias']


def _official_dape_head(p, x, bias):
  """The lines both forwards end with."""
  x_a_bias = np.concatenate((x, np.tile(bias, (x.shape[0], 1, 1, 1))), axis=1)
  x_a_bias = np.transpose(x_a_bias, (0, 2, 3, 1))
  x_a_bias = _official_mlp2(p, x_a_bias)
  x_a_bias = np.transpose(x_a_bias, (0, 3, 1, 2))
  return x + bias + x_a_bias


def _official_kerple_c_forward(p, x):
  """ParallelKerpleLog_C.forward."""
  seq_len_q = x.shape[-2]
  seq_len_k = x.shape[-1]
  diff = np.tril(
      np.tile(np.arange(seq_len_k).reshape(seq_len_k, 1), (1, seq_len_k))
      + np.arange(0, -seq_len_k, -1))
  diff = diff.astype(x.dtype)
  bias_p = np.maximum(p['bias_p'], np.float32(1e-2))  # .data.clamp(min=self.eps)
  bias_a = np.maximum(p['bias_a'], np.float32(1e-2))
  bias = -bias_p * np.log(1 + bias_a * diff)  # log kernel
  if seq_len_q != seq_len_k:
    assert seq_len_q == 1
    bias = bias[:, seq_len_k - 1, :].reshape(bias.shape[0], 1, bias.shape[2])
  return _official_dape_head(p, x, bias)


def _official_get_slopes(n):
  """AliBi_C._get_slopes."""
  def get_slopes_power_of_2(n):
    start = 2 ** (-(2 ** -(math.log2(n) - 3)))
    ratio = start
    return [start * ratio ** i for i in range(n)]

  if math.log2(n).is_integer():
    return get_slopes_power_of_2(n)
  closest_power_of_2 = 2 ** math.floor(math.log2(n))
  return (get_slopes_power_of_2(closest_power_of_2)
          + _official_get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2])


def _official_alibi_c_forward(p, x):
  """AliBi_C.forward (its cache logic left out: it rebuilds the same matrix)."""
  num_heads = x.shape[1]
  seq_len_q = x.shape[-2]
  seq_len_k = x.shape[-1]
  target_seq_len = seq_len_k
  a = -np.tril(
      np.tile(np.arange(target_seq_len).reshape(target_seq_len, 1), (1, target_seq_len))
      + np.arange(0, -target_seq_len, -1))
  a = a.astype(x.dtype)
  slopes = np.asarray(_official_get_slopes(num_heads), np.float32)
  a = a * slopes.reshape(slopes.shape[0], 1, 1)
  if seq_len_q != seq_len_k:
    assert seq_len_q == 1
    a = a[:, seq_len_k - 1, :].reshape(a.shape[0], 1, a.shape[2])
  return _official_dape_head(p, x, a)


def _official_attention_probs(logits):
  """scale_mask_softmax with the causal mask: masked_fill(-10000.0), softmax."""
  t_q, t_k = logits.shape[-2:]
  masked = np.triu(np.ones((t_q, t_k), bool), 1)
  logits = np.where(masked, np.float32(-10000.0), logits)
  logits = logits - logits.max(-1, keepdims=True)
  e = np.exp(logits)
  return e / e.sum(-1, keepdims=True)


# ---------------------------------------------------------------------------


def _official_params(num_heads, width, seed):
  rng = np.random.default_rng(seed)
  normal = lambda *shape: rng.normal(size=shape).astype(np.float32)
  bias_p = (2 * rng.random(num_heads)).astype(np.float32)
  bias_p[0] = 0.003  # below the clamp: the forward sees 1e-2
  return {'bias_p': bias_p[:, None, None],
          'bias_a': rng.random(num_heads).astype(np.float32)[:, None, None],
          'mlp2.0.weight': normal(width, 2 * num_heads),
          'mlp2.0.bias': normal(width),
          'mlp2.2.weight': normal(num_heads, width) / np.sqrt(width),
          'mlp2.2.bias': normal(num_heads)}


def _copy_into(enc, p):
  """The official parameters into our module (kernels `[in, out]`)."""
  if enc.base == 'kerple':
    enc.kerple_p[...] = jnp.asarray(p['bias_p'][:, 0, 0])
    enc.kerple_a[...] = jnp.asarray(p['bias_a'][:, 0, 0])
  enc.w1[...] = jnp.asarray(p['mlp2.0.weight'].T)
  enc.b1[...] = jnp.asarray(p['mlp2.0.bias'])
  enc.w2[...] = jnp.asarray(p['mlp2.2.weight'].T)
  enc.b2[...] = jnp.asarray(p['mlp2.2.bias'])


_OFFICIAL = {'kerple': _official_kerple_c_forward, 'alibi': _official_alibi_c_forward}
_TOL = dict(rtol=2e-5, atol=2e-5)


def _dape(num_heads=3, head_dim=4, **options):
  return pe.make_encoding('dape', d_model=head_dim * num_heads, num_heads=num_heads,
                          rngs=nnx.Rngs(0), **options)


def _qk(b, t, h, d, seed=0):
  """Random q, k `[B, T, H, D]` (NumPy: no compile for the draw)."""
  rng = np.random.default_rng(seed)
  return tuple(rng.normal(size=(b, t, h, d)).astype(np.float32) for _ in range(2))


@nnx.jit
def _bias(enc, q, k, q_positions, k_positions, q_slots, kv_lengths=None):
  """`enc.score_contribution(...).bias` of a self-attention call, compiled once
  per shape (eager dispatch of every op costs more than the arithmetic here)."""
  return enc.score_contribution(aj.ScoreContext(
      q=q, k=k, q_positions=q_positions, k_positions=k_positions, q_slots=q_slots,
      kv_lengths=kv_lengths)).bias


def _scores(q, k):
  """The official `attention_scores`: q·k / norm_factor, `[b, np, sq, sk]`."""
  q, k = np.asarray(q, np.float32), np.asarray(k, np.float32)
  return np.einsum('bqhd,bkhd->bhqk', q, k) / np.float32(math.sqrt(q.shape[-1]))


class DapeMatchesTheOfficialCodeTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('dape_kerple', 'kerple'), ('dape_alibi', 'alibi'))
  def test_dape_bias_plus_scores_is_the_official_forward(self, base):
    """s + our DenseBias = the official forward on every visible entry."""
    b, t, h, d = 2, 7, 3, 4
    p = _official_params(h, 5, seed=1)
    enc = _dape(h, d, base=base, mlp_width=5)
    _copy_into(enc, p)
    q, k = _qk(b, t, h, d)
    scores = _scores(q, k)
    want = _OFFICIAL[base](p, scores)
    ctx = aj.ScoreContext(q=q, k=k, q_positions=np.arange(t), k_positions=np.arange(t),
                          q_slots=np.arange(t))
    spec = enc.score_contribution(ctx)
    self.assertIsInstance(spec, aj.DenseBias)
    self.assertIn('the data-adaptive bias of dape', spec.origin)
    got = np.asarray(spec.bias)
    self.assertEqual(got.dtype, np.float32)
    chex.assert_shape(got, (b, h, t, t))
    lower = np.tril(np.ones((t, t), bool))
    np.testing.assert_allclose((scores + got)[..., lower], want[..., lower], **_TOL)
    np.testing.assert_array_equal(got[..., ~lower], 0.0)  # masked: zero, finite
    # The MLP matters: the official output is not s + B alone.
    plain = _OFFICIAL[base](dict(p, **{'mlp2.2.weight': 0 * p['mlp2.2.weight'],
                                       'mlp2.2.bias': 0 * p['mlp2.2.bias']}), scores)
    self.assertGreater(np.abs(want - plain)[..., lower].min(), 1e-4)

  @parameterized.named_parameters(('dape_kerple', 'kerple'), ('dape_alibi', 'alibi'))
  def test_dape_attention_weights_are_the_official_ones(self, base):
    """Through the module and the dense kernel (which scales q·k by 1/√D and
    adds the bias): softmax of the official logits under its causal mask."""
    t, h = 6, 2
    enc = _dape(h, 4, base=base, mlp_width=6)
    p = _official_params(h, 6, seed=2)
    _copy_into(enc, p)
    mha = aj.MultiHeadAttention(8, h, causal=True, encoding=enc, implementation='dense',
                                rngs=nnx.Rngs(1))
    x = np.random.default_rng(3).normal(size=(2, t, 8)).astype(np.float32)
    _, weights = nnx.jit(lambda m, x: m(x, return_weights=True))(mha, x)
    q, k = nnx.jit(lambda m, x: (m.W_Q(x), m.W_K(x)))(mha, x)
    want = _official_attention_probs(_OFFICIAL[base](p, _scores(q, k)))
    np.testing.assert_allclose(np.asarray(weights), want, rtol=1e-5, atol=1e-6)

  def test_dape_decoding_step_is_the_official_last_row(self):
    """The official seq_len_q == 1 branch (last row of the bias) = our bias for
    one query at its slot over a cache with unwritten (zero) slots."""
    h, d, t, cache = 3, 4, 6, 9
    p = _official_params(h, 4, seed=3)
    enc = _dape(h, d, mlp_width=4)
    _copy_into(enc, p)
    q, k = _qk(1, t, h, d, seed=4)
    want = _OFFICIAL['kerple'](p, _scores(q[:, -1:], k))  # [1, H, 1, T]
    k_cache = np.zeros((1, cache, h, d), np.float32)
    k_cache[:, :t] = k
    positions = np.zeros((1, cache), np.int32)
    positions[:, :t] = np.arange(t)
    got = np.asarray(_bias(enc, q[:, -1:], k_cache, np.array([[t - 1]]), positions,
                           np.array([t - 1])))
    chex.assert_shape(got, (1, h, 1, cache))
    s = _scores(q[:, -1:], k)
    np.testing.assert_allclose(s + got[..., :t], want, **_TOL)
    np.testing.assert_array_equal(got[..., t:], 0.0)

  def test_dape_pure_functions_and_grouped_queries(self):
    """dape_scores repeats key heads for grouped queries; dape_bias(visible=None)
    is the official MLP head at every (i, j), for any base bias B given."""
    q, k = _qk(1, 5, 4, 3, seed=5)
    k1 = k[:, :, :2]
    chex.assert_trees_all_close(pe.dape_scores(q, k1),
                                pe.dape_scores(q, np.repeat(k1, 2, axis=2)), atol=1e-6)
    p = _official_params(4, 3, seed=6)
    s = _scores(q, k)
    base = np.random.default_rng(7).normal(size=(1, 4, 5, 5)).astype(np.float32)
    got = pe.dape_bias(s, base, p['mlp2.0.weight'].T, p['mlp2.0.bias'],
                       p['mlp2.2.weight'].T, p['mlp2.2.bias'])
    want = _official_dape_head(p, s, base[0]) - s
    np.testing.assert_allclose(np.asarray(got), want, **_TOL)


class DapeDtypesAndGradientsTest(chex.TestCase, parameterized.TestCase):

  def test_dape_bfloat16_model_path(self):
    """bf16 activations: the bias stays float32; outputs finite and close to f32."""
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 7, 16)), jnp.float32)
    outs = {}
    for dtype in (jnp.float32, jnp.bfloat16):
      mha = aj.MultiHeadAttention(16, 4, causal=True, encoding='dape', dtype=dtype,
                                  rngs=nnx.Rngs(0))
      out, weights = nnx.jit(lambda m, x: m(x, return_weights=True))(mha, x.astype(dtype))
      self.assertEqual(out.dtype, dtype)
      self.assertEqual(weights.dtype, jnp.float32)
      q, k = nnx.jit(lambda m, x: (m.W_Q(x), m.W_K(x)))(mha, x.astype(dtype))
      self.assertEqual(q.dtype, dtype)
      bias = _bias(mha.positional, q, k, np.arange(7), np.arange(7), np.arange(7))
      self.assertEqual(bias.dtype, jnp.float32)
      chex.assert_tree_all_finite((out, weights))
      outs[dtype] = out
    np.testing.assert_allclose(np.asarray(outs[jnp.bfloat16], np.float32),
                               np.asarray(outs[jnp.float32]), atol=5e-2)

  def test_dape_trains_every_parameter_and_ignores_padding(self):
    """MLP and KERPLE's p, a get finite, nonzero gradients (p below the 1e-2
    floor too: the straight-through clamp); NaN keys at padded slots do not
    reach the bias."""
    enc = _dape(2, 4)
    enc.kerple_p[...] = jnp.array([0.003, 1.5])
    q, k = _qk(2, 6, 2, 4, seed=8)
    lengths = np.array([6, 4])
    k_nan = k.copy()
    k_nan[1, 4:] = np.nan
    t = np.arange(6)
    bias = _bias(enc, q, k_nan, t, t, t, lengths)
    chex.assert_tree_all_finite(bias)
    chex.assert_trees_all_close(bias, _bias(enc, q, k, t, t, t, lengths))
    ctx = lambda k: aj.ScoreContext(q=q, k=k, q_positions=t, k_positions=t, q_slots=t,
                                    kv_lengths=lengths)
    _, params = nnx.split(enc, nnx.Param)

    def loss(params):
      e = nnx.merge(nnx.graphdef(enc), params)
      return jnp.sum(e.score_contribution(ctx(k)).bias ** 2)

    grads = jax.jit(jax.grad(loss))(params)
    leaves = jax.tree_util.tree_leaves_with_path(grads)
    self.assertEqual(len(leaves), 6)  # w1, b1, w2, b2, p, a
    for path, g in leaves:
      chex.assert_tree_all_finite(g)
      self.assertGreater(float(jnp.abs(g).max()), 0.0, msg=str(path))
    self.assertTrue(np.all(np.abs(np.asarray(grads['kerple_p'][...])) > 0))  # both heads

  def test_dape_is_per_layer(self):
    """One MLP per attention layer, as the official code builds (a model asks
    the class; two builds draw different weights)."""
    self.assertTrue(pe.DAPE.per_layer)
    rngs = nnx.Rngs(0)
    first, second = (pe.make_encoding('dape', d_model=8, num_heads=2, rngs=rngs)
                     for _ in range(2))
    self.assertFalse(np.allclose(first.w1[...], second.w1[...]))


class DapeConfigTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('dape_base', dict(base='fire'), r"dape: base='fire' must be one of \['kerple', 'alibi'\]"),
      ('dape_width_zero', dict(mlp_width=0), r'dape: mlp_width=0 must be an integer >= 1'),
      ('dape_width_float', dict(mlp_width=2.5), r'dape: mlp_width=2.5 must be an integer'))
  def test_dape_bad_options_name_the_key(self, options, message):
    with self.assertRaisesRegex(ValueError, message):
      _dape(2, **options)

  def test_dape_unknown_option_and_wrong_heads(self):
    with self.assertRaisesRegex(ValueError, r"'dape' got an unknown option among \['width'\]"):
      _dape(2, width=8)
    q, k = _qk(1, 3, 4, 2)
    with self.assertRaisesRegex(ValueError, r'dape: built for 2 heads'):
      _dape(2, 4).score_contribution(aj.ScoreContext(
          q=q, k=k, q_positions=np.arange(3), k_positions=np.arange(3)))

  def test_dape_lab_config_validates(self):
    config = resolve_options(copy_config.get_config('encoding=dape,scale=tiny'))
    self.assertEqual(config.model.encoding_options.dape.base, 'kerple')
    self.assertEqual(config.model.encoding_options.dape.mlp_width, 32)
    validate.validate_config(config)
    config.model.encoding_options.dape.width = 8
    with self.assertRaisesRegex(validate.ConfigError,
                                r'model\.encoding_options\.dape\.width: .*mlp_width'):
      validate.validate_config(config)
    config = resolve_options(copy_config.get_config('encoding=dape,scale=tiny'))
    config.model.attention_implementation = 'chunked'
    config.model.encoding_options.dape.base = 'rope'
    with self.assertRaisesRegex(validate.ConfigError,
                                r"model\.encoding_options\.dape\.base='rope' must be one of"):
      validate.validate_config(config)
    config.model.encoding_options.dape.base = 'alibi'
    with self.assertRaisesRegex(validate.ConfigError, 'the data-adaptive bias of dape'):
      validate.validate_config(config)


if __name__ == '__main__':
  absltest.main()
