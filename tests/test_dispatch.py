"""Choosing an attention implementation: 'auto', and clear refusals."""

import chex
import jax
import jax.numpy as jnp
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.attention import scaled_dot_product_attention
from attention_jax.attention import select_implementation

CALL = dict(dtype=jnp.bfloat16, head_dim=64, return_weights=False, dense_mask=False,
            dense_bias=False)


class SelectTest(parameterized.TestCase):

  @parameterized.parameters(16, 255, 256, 65536)
  def test_auto_on_cpu_never_picks_cudnn(self, t_k):
    for dtype in (jnp.float32, jnp.bfloat16):
      got = select_implementation('auto', t_k=t_k, backend='cpu', **dict(CALL, dtype=dtype))
      self.assertEqual(got, 'chunked' if t_k >= 256 else 'dense')

  def test_auto_on_gpu_picks_cudnn_when_it_can(self):
    self.assertEqual(select_implementation('auto', t_k=64, backend='gpu', **CALL), 'cudnn')
    f32 = dict(CALL, dtype=jnp.float32)
    self.assertEqual(select_implementation('auto', t_k=4096, backend='gpu', **f32), 'chunked')
    weights = dict(CALL, return_weights=True)
    self.assertEqual(select_implementation('auto', t_k=4096, backend='gpu', **weights), 'dense')

  def test_refusals_name_the_reason(self):
    with self.assertRaisesRegex(ValueError, r"'cudnn' cannot serve this call: a GPU \(the default "
                                r"backend is 'cpu'\); float16 or bfloat16 inputs \(got float32\)"):
      select_implementation('cudnn', t_k=8, backend='cpu', **dict(CALL, dtype=jnp.float32))
    with self.assertRaisesRegex(ValueError, 'head_dim a multiple of 8 up to 128 \\(got 12\\)'):
      select_implementation('cudnn', t_k=8, backend='gpu', **dict(CALL, head_dim=12))
    with self.assertRaisesRegex(ValueError, "'chunked' cannot serve this call: a dense mask"):
      select_implementation('chunked', t_k=8, **dict(CALL, dense_mask=True))
    with self.assertRaisesRegex(ValueError, "implementation='flash'; choose one of"):
      select_implementation('flash', t_k=8, **CALL)
    q = jnp.ones((1, 4, 2, 8))
    with self.assertRaisesRegex(ValueError, "chunked_strategy='fast'; choose one of"):
      aj.scaled_dot_product_attention(q, q, q, implementation='dense', chunked_strategy='fast')


class FunctionTest(chex.TestCase, parameterized.TestCase):

  @parameterized.product(window=(None, 6), h_kv=(1, 3))
  def test_chunked_equals_dense_with_structure(self, window, h_kv):
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (2, 29, 3, 8))
    k, v = (jax.random.normal(kk, (2, 29, h_kv, 8)) for kk in keys[1:])
    kw = dict(causal=True, kv_lengths=jnp.array([29, 11]), window=window,
              alibi_slopes=aj.positional.alibi_slopes(3), chunk_size=8)
    dense, weights = scaled_dot_product_attention(q, k, v, implementation='dense',
                                                  return_weights=True, **kw)
    chunked, none = scaled_dot_product_attention(q, k, v, implementation='chunked', **kw)
    self.assertIsNone(none)
    chex.assert_shape(weights, (2, 3, 29, 29))
    chex.assert_trees_all_close(chunked, dense, atol=1e-5)

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
