"""PaTH and PaTH-FoX (Yang et al. 2025) as encodings, checked against FLA's layer.

Official code: fla-org/flash-linear-attention at
bc3b101dcb713ddc5bd8924b66754eb68b5ccf89. Transcribed below in jax.numpy
(torch layout, weights `[out, in]`): `PaTHAttention.forward` of
fla/layers/path_attn.py (last changed in f7c2c191) on its training path
(no attention_mask, no cache) with the layer's defaults (use_low_rank_w,
use_w_shortconv with conv_size 3 and no bias, no QK-norm), the op being
`naive_path_attn` (transcribed in tests/attention/test_path.py).
"""

from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.attention import path as attention_path
from attention_jax.positional.path import PaTH
from tests.attention.test_path import naive_path_attn

D_MODEL, HEADS, KV_HEADS = 16, 4, 2
HEAD_DIM = D_MODEL // HEADS


# ---------------------------------------------------------------------------
# FLA's layer, transcribed.
# ---------------------------------------------------------------------------
def _fla_l2_norm(x, eps=1e-6):  # fla.modules.l2norm: x / sqrt(Σx² + eps)
  return x / jnp.sqrt(jnp.sum(x * x, -1, keepdims=True) + eps)


def _fla_short_convolution(x, weight):
  """ShortConvolution(activation='silu', bias=False): x [B, T, C], weight
  [C, 1, K] (nn.Conv1d, groups=C, padding=K-1, the first T outputs)."""
  k = weight.shape[-1]
  padded = jnp.pad(x, ((0, 0), (k - 1, 0), (0, 0)))
  out = sum(padded[:, m:m + x.shape[1]] * weight[:, 0, m] for m in range(k))
  return jax.nn.silu(out)


def fla_path_layer(p, hidden_states, num_heads, num_kv_heads, use_forget_gate):
  """`PaTHAttention.forward` (training path); p: the layer's weights by name."""
  head_dim = hidden_states.shape[-1] // num_heads
  linear = lambda name, x: x @ p[name + '.weight'].T + p.get(name + '.bias', 0.0)
  q, k, v = (linear(n, hidden_states) for n in ('q_proj', 'k_proj', 'v_proj'))
  w = linear('w_proj.1', linear('w_proj.0', hidden_states))
  beta = jax.nn.sigmoid(linear('bt_proj', hidden_states)) * 2
  g = jax.nn.log_sigmoid(linear('g_proj', hidden_states)) if use_forget_gate else None
  w = _fla_short_convolution(w, p['w_conv1d.weight'])
  heads = lambda x: x.reshape(*x.shape[:2], -1, head_dim)  # '... (h d) -> ... h d'
  q, k, v, w = heads(q), heads(k), heads(v), heads(w)
  w = _fla_l2_norm(w)
  if g is None:  # parallel_path_attn with g=None is the reference with zero gates
    g = jnp.zeros(q.shape[:3])
  o = naive_path_attn(q, k, v, w, beta, g, head_dim ** -0.5)
  return linear('o_proj', o.reshape(*o.shape[:2], -1))


def fla_weights(state) -> dict:
  """Our module's parameters under FLA's names and layouts."""
  d = D_MODEL
  get = lambda *path: state[path][...] if path in state else None
  enc = lambda name: state['positional', name][...]
  p = {'q_proj.weight': get('W_Q', 'kernel').reshape(d, -1).T,
       'k_proj.weight': get('W_K', 'kernel').reshape(d, -1).T,
       'v_proj.weight': get('W_V', 'kernel').reshape(d, -1).T,
       'o_proj.weight': get('W_O', 'kernel').reshape(-1, d).T,
       'w_proj.0.weight': enc('w_down').T, 'w_proj.1.weight': enc('w_up').T,
       'w_conv1d.weight': enc('w_conv').T[:, None, :],
       'bt_proj.weight': enc('beta_kernel').T, 'bt_proj.bias': enc('beta_bias')}
  if ('positional', 'gate_kernel') in state:
    p['g_proj.weight'] = enc('gate_kernel').T
    p['g_proj.bias'] = enc('gate_bias')
  return p


def _module(encoding='path', implementation='auto', **kw):
  mha = aj.MultiHeadAttention(D_MODEL, HEADS, causal=True, num_kv_heads=KV_HEADS,
                              encoding=encoding, encoding_options={'num_kv_heads': KV_HEADS},
                              implementation=implementation, rngs=nnx.Rngs(0), **kw)
  # Larger than the official init, so that w, β and the gates matter.
  for name in ('w_down', 'w_up', 'w_conv', 'beta_kernel', 'gate_kernel'):
    param = getattr(mha.encoding, name)
    if param is not None:
      param[...] = param[...] * 25.0
  return mha


def _flat(state):
  return {tuple(str(k) for k in path): v for path, v in nnx.to_flat_state(state)}


class PathMatchesFlaTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('path', 'path', False), ('path_fox', 'path_fox', True))
  def test_path_layer_equals_fla_layer_outputs_and_gradients(self, encoding, gate):
    mha = _module(encoding)
    x = jax.random.normal(jax.random.key(1), (2, 11, D_MODEL))
    graphdef, state = nnx.split(mha)
    flat = _flat(state)

    def ours(state, x):
      return nnx.merge(graphdef, state)(x)

    def theirs(state, x):
      return fla_path_layer(fla_weights(_flat(state)), x, HEADS, KV_HEADS, gate)

    chex.assert_trees_all_close(ours(state, x), theirs(state, x), atol=2e-5, rtol=2e-5)
    self.assertEqual(('positional', 'gate_kernel') in flat, gate)
    loss = lambda f: lambda s, x: jnp.sum(jnp.sin(f(s, x)))
    got = jax.jit(jax.grad(loss(ours), argnums=(0, 1)))(state, x)
    want = jax.jit(jax.grad(loss(theirs), argnums=(0, 1)))(state, x)
    chex.assert_trees_all_close(got, want, atol=1e-4, rtol=1e-4)

  def test_path_initialisation_is_flas(self):
    enc = aj.make_encoding('path_fox', d_model=64, num_heads=4, rngs=nnx.Rngs(0),
                           num_kv_heads=2)
    chex.assert_shape((enc.w_down[...], enc.w_up[...], enc.w_conv[...]),
                      ((64, 32), (32, 32), (3, 32)))
    chex.assert_shape((enc.beta_kernel[...], enc.gate_kernel[...]), ((64, 2), (64, 4)))
    for p in (enc.w_down, enc.w_up, enc.w_conv, enc.beta_kernel, enc.gate_kernel):
      self.assertAlmostEqual(float(jnp.std(p[...])), 0.02, delta=0.004)
    np.testing.assert_array_equal(enc.beta_bias[...], 0.0)
    full = aj.make_encoding('path', d_model=64, num_heads=4, rngs=nnx.Rngs(0),
                            low_rank_w=False, conv_size=0)
    self.assertIsNone(full.w_up)
    self.assertIsNone(full.w_conv)
    self.assertIsNone(full.gate_kernel)
    chex.assert_shape(full.w_down[...], (64, 64))


class PathModuleTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('path', 'path'), ('path_fox', 'path_fox'))
  def test_path_blockwise_module_equals_dense(self, encoding):
    x = jax.random.normal(jax.random.key(2), (2, 13, D_MODEL))
    outs, grads = {}, {}
    for impl in ('dense', 'path_blockwise'):
      mha = _module(encoding, implementation=impl)
      outs[impl] = mha(x)
      grads[impl] = jax.grad(lambda x: jnp.sum(jnp.tanh(mha(x))))(x)
    chex.assert_trees_all_close(outs['path_blockwise'], outs['dense'], atol=2e-5, rtol=2e-5)
    chex.assert_trees_all_close(grads['path_blockwise'], grads['dense'], atol=1e-4,
                                rtol=1e-4)

  @parameterized.named_parameters(('path', 'path'), ('path_fox', 'path_fox'))
  def test_path_decoding_equals_the_full_pass(self, encoding):
    mha = _module(encoding)
    x = jax.random.normal(jax.random.key(3), (2, 9, D_MODEL))
    want = mha(x)
    cache = mha.init_cache(2, 12)
    out, cache = mha.extend(x[:, :4], cache, 0)  # prefill
    pieces = [out]
    for i in range(4, 9):
      out, cache = mha.extend(x[:, i:i + 1], cache, jnp.int32(i))
      pieces.append(out)
    chex.assert_trees_all_close(jnp.concatenate(pieces, 1), want, atol=2e-5, rtol=2e-5)

  @parameterized.named_parameters(('path', 'path'), ('path_fox', 'path_fox'))
  def test_path_prefill_of_the_whole_cache_is_the_full_pass(self, encoding):
    # Greedy decoding prefills every slot at once: that call's queries sit at
    # slots 0 … T-1, so it takes the full pass's form (the blocks shared by
    # every query, O(T²) memory), never `path_logits_at` (a block per query:
    # O(T² · C) memory, 10 GB on the copy study's evaluation), jitted too.
    mha = _module(encoding)
    x = jax.random.normal(jax.random.key(8), (2, 9, D_MODEL))
    with mock.patch.object(attention_path, 'path_logits_at',
                           side_effect=AssertionError('path_logits_at in a full prefill')):
      out, _ = nnx.jit(lambda m, y: m.extend(y, m.init_cache(2, 9), jnp.int32(0)))(mha, x)
    chex.assert_trees_all_close(out, mha(x), atol=2e-5, rtol=2e-5)

  def test_path_rewritten_slots_do_not_leak(self):
    # Greedy decoding prefills stale tokens, then rewrites them one by one.
    mha = _module('path_fox')
    x = jax.random.normal(jax.random.key(4), (1, 8, D_MODEL))
    stale = jax.random.normal(jax.random.key(5), (1, 8, D_MODEL))
    _, cache = mha.extend(jnp.concatenate([x[:, :3], stale[:, 3:]], 1), mha.init_cache(1, 8), 0)
    pieces = []
    for i in range(3, 8):
      out, cache = mha.extend(x[:, i:i + 1], cache, i)
      pieces.append(out)
    chex.assert_trees_all_close(jnp.concatenate(pieces, 1), mha(x)[:, 3:], atol=2e-5,
                                rtol=2e-5)

  @pytest.mark.slow
  def test_path_lm_generate_equals_rerunning(self):
    model = aj.TransformerLM(vocab_size=11, d_model=16, num_heads=4, num_layers=2, mlp_dim=32,
                             encoding='path_fox', rngs=nnx.Rngs(0))
    prompt = jax.random.randint(jax.random.key(6), (2, 3), 0, 11)
    got = aj.generate(model, prompt, 4)
    seq = prompt
    for _ in range(4):
      nxt = jnp.argmax(model(seq)[:, -1], -1).astype(jnp.int32)
      seq = jnp.concatenate([seq, nxt[:, None]], 1)
    np.testing.assert_array_equal(got, seq)

  @parameterized.named_parameters(('dense', 'dense'), ('path_blockwise', 'path_blockwise'))
  def test_path_bfloat16_module(self, implementation):
    x = jax.random.normal(jax.random.key(7), (2, 10, D_MODEL))
    mha16 = _module('path_fox', implementation=implementation, dtype=jnp.bfloat16)
    out16 = mha16(x.astype(jnp.bfloat16))
    self.assertEqual(out16.dtype, jnp.bfloat16)
    self.assertTrue(bool(jnp.all(jnp.isfinite(out16.astype(jnp.float32)))))
    # The same projections' bf16 outputs, then PaTH in float32 (the reference).
    q, k, v = (getattr(mha16, n)(x.astype(jnp.bfloat16)) for n in ('W_Q', 'W_K', 'W_V'))
    feats = mha16.encoding.token_features(x.astype(jnp.bfloat16))
    w, beta = mha16.encoding.householder(feats)
    g = feats[..., -HEADS:]
    o = naive_path_attn(*(a.astype(jnp.float32) for a in (q, k, v)), w, beta, g,
                        HEAD_DIM ** -0.5)
    want = mha16.W_O(o.astype(jnp.bfloat16))
    chex.assert_trees_all_close(out16.astype(jnp.float32), want.astype(jnp.float32),
                                atol=2e-2, rtol=2e-2)


class PathErrorsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('kv_heads', {'num_kv_heads': 3}, r'path: num_kv_heads=3 must divide num_heads=4'),
      ('conv', {'conv_size': -1}, r'path: conv_size=-1 must be an integer >= 0'),
      ('flag', {'forget_gate': 'yes'}, r"path: forget_gate='yes' must be True or False"),
      ('block', {'block_size': 0}, r'path: block_size=0 must be an integer >= 1'),
      ('std', {'weight_std': -1.0}, r'path: weight_std=-1.0 must be a finite number >= 0'))
  def test_path_bad_options_name_the_key(self, options, message):
    with self.assertRaisesRegex(ValueError, message):
      aj.make_encoding('path', d_model=16, num_heads=4, rngs=nnx.Rngs(0), **options)

  def test_path_is_causal_self_attention_only(self):
    with self.assertRaisesRegex(ValueError, r'path_fox: PaTH is causal .* causal=False is '
                                'not supported'):
      aj.make_encoding('path_fox', d_model=16, num_heads=4, causal=False, rngs=nnx.Rngs(0))
    enc = aj.make_encoding('path', d_model=16, num_heads=4, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r'built with causal=True'):
      aj.MultiHeadAttention(16, 4, causal=False, encoding=enc, rngs=nnx.Rngs(0))
    q = jnp.zeros((1, 3, 4, 4))
    context = aj.ScoreContext(q=q, k=q, q_positions=np.arange(3), k_positions=np.arange(3),
                              k_features=jnp.zeros((1, 3, 68)))
    with self.assertRaisesRegex(ValueError, r'path: PaTH needs each query\'s place among the '
                                r'keys \(q_slots\); cross-attention has none'):
      enc.score_contribution(context)
    with self.assertRaisesRegex(ValueError, r'path: the projections read layer inputs '
                                r'\[B, T, 16\], got \(1, 3, 8\)'):
      enc.token_features(jnp.zeros((1, 3, 8)))


if __name__ == '__main__':
  absltest.main()
