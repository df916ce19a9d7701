"""Choosing an attention implementation: 'auto', and clear refusals."""

from unittest import mock

import chex
import jax
import jax.numpy as jnp
from absl.testing import absltest
import pytest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.attention import KERNELS
from attention_jax.attention import Request
from attention_jax.attention import dispatch
from attention_jax.attention.dispatch import obstacles
from attention_jax.attention import scaled_dot_product_attention
from attention_jax.attention import select_implementation

CALL = dict(dtype=jnp.bfloat16, head_dim=64)
T5 = aj.DenseBias(jnp.zeros((1, 1, 1, 1)),
                  'the bias of T5RelativeBias, which is not linear in i - j')


def _select(requested, t_k, backend='cpu', **kw):
  return select_implementation(requested, Request(t_k=t_k, **dict(CALL, **kw)), backend)


class SelectTest(parameterized.TestCase):

  @parameterized.parameters(16, 255, 256, 65536)
  def test_auto_on_cpu_never_picks_cudnn(self, t_k):
    for dtype in (jnp.float32, jnp.bfloat16):
      got = _select('auto', t_k, dtype=dtype, scores=(aj.LinearBias,))
      self.assertEqual(got, 'chunked' if t_k >= 256 else 'dense')

  def test_auto_on_gpu_picks_cudnn_when_it_can(self):
    self.assertEqual(_select('auto', 64, backend='gpu'), 'cudnn')
    self.assertEqual(_select('auto', 4096, backend='gpu', dtype=jnp.float32), 'pallas_gpu')
    self.assertEqual(_select('auto', 4096, backend='gpu', return_weights=True), 'dense')
    self.assertEqual(_select('auto', 4096, backend='gpu', scores=(T5,)), 'cudnn')
    self.assertEqual(_select('auto', 4096, scores=(T5,)), 'dense')

  def test_refusals_name_every_obstacle(self):
    with self.assertRaisesRegex(ValueError, r"'cudnn' cannot serve this call: return_weights="
                                r"True \(only 'dense' forms the weights\); a GPU \(the default "
                                r"backend is 'cpu'\); float16 or bfloat16 inputs \(got float32\)"):
      _select('cudnn', 8, dtype=jnp.float32, return_weights=True)
    with self.assertRaisesRegex(ValueError, 'head_dim a multiple of 8 up to 128 \\(got 12\\)'):
      _select('cudnn', 8, backend='gpu', head_dim=12)
    with self.assertRaisesRegex(ValueError, r"'chunked' cannot serve this call: return_weights="
                                r"True .*; a dense mask \(give causal=, window= or kv_lengths= "
                                r"instead\); a dense bias from the bias of T5RelativeBias, which "
                                r"is not linear in i - j \[DenseBias: 'cudnn', 'tpu_flash', "
                                r"'dense' take it\]"):
      _select('chunked', 8, dense_mask=True, return_weights=True, scores=(T5,))
    with self.assertRaisesRegex(ValueError, "implementation='flash'; choose one of"):
      _select('flash', 8)
    q = jnp.ones((1, 4, 2, 8))
    with self.assertRaisesRegex(ValueError, "chunked_strategy='fast'; choose one of"):
      aj.scaled_dot_product_attention(q, q, q, implementation='dense', chunked_strategy='fast')

  def test_the_table_is_what_auto_walks(self):
    order = ['cudnn', 'splash', 'pallas_tpu', 'pallas_gpu', 'chunked', 'path_blockwise',
             'tpu_flash', 'dense']
    self.assertEqual(list(KERNELS), order)
    self.assertEqual(aj.attention.IMPLEMENTATIONS, (*order, 'auto'))
    self.assertTrue(KERNELS['dense'].weights and not KERNELS['chunked'].dense_mask)


class CudnnRulesTest(parameterized.TestCase):
  """cuDNN's restrictions, as obstacles of its row (no GPU needed)."""

  def _cudnn(self, **kw):
    return obstacles('cudnn', Request(**dict(dict(t_k=128, **CALL), **kw)), 'gpu')

  def test_a_window_needs_causal(self):
    self.assertEqual(self._cudnn(window=16, causal=True), [])
    self.assertEqual(self._cudnn(window=16, causal=True, kv_lengths=True), [])
    self.assertEqual(self._cudnn(window=16), [
        'window=16 without causal=True (it serves a causal, left-only window)'])
    with self.assertRaisesRegex(ValueError, "'cudnn' cannot serve this call: window=16 "
                                'without causal=True'):
      _select('cudnn', 128, backend='gpu', window=16)
    # 'auto' then falls back to a kernel with symmetric windows.
    self.assertEqual(_select('auto', 4096, backend='gpu', window=16), 'pallas_gpu')

  def test_our_window_reaches_jax_nn_as_a_left_window(self):
    # jax.nn's XLA path stands in for cuDNN (same arguments, same semantics).
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, (2, 16, 2, 8), jnp.bfloat16) for kk in keys)
    # Every query keeps a key (jax.nn gives a row with none no zeros, unlike dense.py).
    kw = dict(causal=True, window=5, kv_lengths=jnp.array([16, 12]))
    real, calls = jax.nn.dot_product_attention, []
    def xla(*args, implementation, **options):
      calls.append(options)
      return real(*args, implementation='xla', **options)
    with mock.patch.object(dispatch, 'current_backend', return_value='gpu'), \
         mock.patch.object(jax.nn, 'dot_product_attention', xla):
      got = scaled_dot_product_attention(q, k, v, implementation='cudnn', **kw)
    self.assertEqual(calls[0]['local_window_size'], (4, 0))
    want = scaled_dot_product_attention(q, k, v, implementation='dense', **kw)
    chex.assert_trees_all_close(got.astype(jnp.float32), want.astype(jnp.float32),
                                atol=2e-2)

  def test_a_mask_or_bias_must_be_full_along_the_lengths(self):
    self.assertEqual(self._cudnn(dense_mask=True), [])
    self.assertEqual(self._cudnn(scores=(aj.DenseBias,), score_broadcast=True),
                     ['a mask or bias broadcast along T_q or T_k (it takes them '
                      '[.., T_q, T_k])'])
    q = jnp.ones((1, 8, 2, 8), jnp.bfloat16)
    with mock.patch.object(dispatch, 'current_backend', return_value='gpu'):
      with self.assertRaisesRegex(ValueError, "'cudnn' cannot serve this call: a mask or "
                                  r'bias broadcast along T_q or T_k \(it takes'):
        scaled_dot_product_attention(q, q, q, bias=jnp.ones((1, 1, 1, 8)),
                                     implementation='cudnn')

  @parameterized.parameters(dict(dense_mask=True), dict(scores=(aj.LinearBias,)),
                            dict(scores=(aj.DifferenceBias,)), dict(scores=(aj.WindowBias,)))
  def test_a_mask_or_bias_needs_even_lengths(self, **kind):
    self.assertEqual(self._cudnn(t_q=128, t_k=130, **kind), [])
    self.assertEqual(self._cudnn(t_q=127, t_k=127, **kind), [
        'with a mask or bias, T_q and T_k multiples of 2 (got T_q=127, T_k=127)'])
    self.assertEqual(self._cudnn(t_q=127, t_k=127, causal=True, kv_lengths=True), [])

  def test_head_dims_value_dims_and_dtypes(self):
    self.assertEqual(self._cudnn(head_dim=128, gqa=True), [])
    self.assertEqual(self._cudnn(head_dim=136), [
        'head_dim a multiple of 8 up to 128 (got 136)'])
    self.assertEqual(self._cudnn(v_head_dim=32), ['D_v == D (got D=64, D_v=32)'])
    self.assertEqual(self._cudnn(dtype=jnp.float32),
                     ['float16 or bfloat16 inputs (got float32)'])
    self.assertEqual(self._cudnn(dtype=jnp.float16), [])


class FunctionTest(chex.TestCase, parameterized.TestCase):

  @parameterized.product(window=(None, 6), h_kv=(1, 3))
  @pytest.mark.slow
  def test_chunked_equals_dense_with_structure(self, window, h_kv):
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (2, 29, 3, 8))
    k, v = (jax.random.normal(kk, (2, 29, h_kv, 8)) for kk in keys[1:])
    kw = dict(causal=True, kv_lengths=jnp.array([29, 11]), window=window,
              score_bias=aj.LinearBias(aj.positional.alibi_slopes(3)), chunk_size=8)
    dense, weights = scaled_dot_product_attention(q, k, v, implementation='dense',
                                                  return_weights=True, **kw)
    chunked = scaled_dot_product_attention(q, k, v, implementation='chunked', **kw)
    chex.assert_shape(weights, (2, 3, 29, 29))
    chex.assert_trees_all_close(chunked, dense, atol=1e-5)
    loss = lambda impl: lambda *a: jnp.sum(jnp.sin(scaled_dot_product_attention(
        *a, implementation=impl, **kw)))
    chex.assert_trees_all_close(jax.grad(loss('chunked'), (0, 1, 2))(q, k, v),
                                jax.grad(loss('dense'), (0, 1, 2))(q, k, v), atol=1e-5)

  def test_a_dense_score_bias_adds_to_the_bias_array(self):
    q = jax.random.normal(jax.random.key(1), (2, 5, 2, 8))
    enc = jax.random.normal(jax.random.key(2), (1, 2, 5, 5))
    user = jax.random.normal(jax.random.key(3), (5, 5))
    got = scaled_dot_product_attention(q, q, q, bias=user, score_bias=aj.DenseBias(enc))
    want, _ = aj.multi_head_attention(q, q, q, bias=enc + user)
    chex.assert_trees_all_close(got, want, atol=1e-6)
    with self.assertRaisesRegex(ValueError, "'chunked' cannot serve this call: a dense bias "
                                r'from the bias= argument \[DenseBias: .*\]; a dense bias from '
                                'the bias of T5'):
      scaled_dot_product_attention(q, q, q, bias=user, implementation='chunked',
                                   score_bias=aj.DenseBias(enc, 'the bias of T5'))
    with self.assertRaisesRegex(ValueError, 'DenseBias takes a rank-4 bias'):
      aj.DenseBias(enc[0])
    with self.assertRaisesRegex(ValueError, 'a LinearBias of 3 slopes for 2 heads'):
      scaled_dot_product_attention(q, q, q, score_bias=aj.LinearBias((1.0, 2.0, 3.0)))

  def test_weights_only_on_request(self):
    q = jnp.ones((1, 4, 2, 8))
    out = scaled_dot_product_attention(q, q, q)
    chex.assert_shape(out, (1, 4, 2, 8))
    out, weights = scaled_dot_product_attention(q, q, q, return_weights=True)
    chex.assert_shape(weights, (1, 2, 4, 4))

  def test_transformer_auto_runs_long_sequences_blockwise_and_exactly(self):
    kw = dict(vocab_size=8, d_model=16, num_heads=2, num_layers=1, mlp_dim=16,
              encoding='alibi', max_positions=None)
    auto = aj.TransformerLM(implementation='auto', rngs=nnx.Rngs(0), **kw)
    dense = aj.TransformerLM(implementation='dense', rngs=nnx.Rngs(0), **kw)
    tokens = jnp.arange(1100)[None] % 8
    jaxpr = str(jax.make_jaxpr(lambda t: auto(t))(tokens)).replace(' ', '')
    self.assertIn('1,128,1100', jaxpr)  # 'unrolled' scores: 128 queries × their prefix
    self.assertNotIn('1100,1100', jaxpr)  # no T × T array anywhere
    chex.assert_trees_all_close(auto(tokens), dense(tokens), atol=1e-4)


if __name__ == '__main__':
  absltest.main()
