"""The modules' logit soft-capping and learned sink logits: the parameter,
equality with the functions, cached decoding, TransformerLM, refusals."""

import chex
import jax
import jax.numpy as jnp
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj

B, T, H, D = 2, 7, 4, 8
SINKS = jnp.array([0.5, -1.0, 2.0, 0.0])


def _x(t=T):
  return jax.random.normal(jax.random.key(1), (B, t, H * D))


def _mha(**kw):
  mha = aj.MultiHeadAttention(H * D, H, causal=True, encoding='rope', num_kv_heads=2,
                              logit_soft_cap=2.0, sinks=True, rngs=nnx.Rngs(0), **kw)
  mha.sink_logits[...] = SINKS  # away from the zero start, so a wrong head shows
  return mha


class ModuleTest(chex.TestCase, parameterized.TestCase):

  def test_one_zero_sink_logit_per_head_at_sink_logits(self):
    mha = aj.MultiHeadAttention(H * D, H, causal=True, sinks=True, rngs=nnx.Rngs(0))
    params = nnx.state(mha, nnx.Param)
    chex.assert_trees_all_equal(params['sink_logits'][...], jnp.zeros(H))
    plain = aj.MultiHeadAttention(H * D, H, causal=True, rngs=nnx.Rngs(0))
    self.assertIsNone(plain.sink_logits)
    # The other parameters are drawn as without sinks.
    chex.assert_trees_all_equal(mha.W_Q.kernel[...], plain.W_Q.kernel[...])

  @parameterized.parameters('dense', 'chunked')
  def test_equals_the_function_in_outputs_and_sink_gradients(self, implementation):
    mha, x = _mha(implementation=implementation), _x()
    q, k = mha.encoded_queries_keys(x)
    v = mha.W_V(x)

    def by_function(sinks):
      return mha.W_O(aj.scaled_dot_product_attention(
          q, k, v, causal=True, implementation='dense', logit_soft_cap=2.0, sinks=sinks))

    chex.assert_trees_all_close(mha(x), by_function(SINKS), atol=1e-5)
    grad = nnx.grad(lambda m: jnp.sum(jnp.sin(m(x))))(mha)
    chex.assert_trees_all_close(
        grad['sink_logits'][...],
        jax.grad(lambda s: jnp.sum(jnp.sin(by_function(s))))(SINKS), atol=1e-5)
    without = _mha(implementation=implementation)
    without.sink_logits[...] = jnp.full(H, -1e4)  # a sink that takes nothing
    self.assertGreater(float(jnp.abs(mha(x) - without(x)).max()), 1e-3)

  def test_cached_decoding_equals_the_full_pass(self):
    mha, x = _mha(), _x()
    cache = mha.init_cache(B, T)
    first, cache = mha.extend(x[:, :3], cache, 0)
    steps = [first]
    for i in range(3, T):
      out, cache = mha.extend(x[:, i:i + 1], cache, i)
      steps.append(out)
    chex.assert_trees_all_close(jnp.concatenate(steps, 1), mha(x), atol=1e-5)

  def test_transformer_lm_gives_them_to_every_layer_and_decodes_alike(self):
    lm = aj.TransformerLM(vocab_size=11, d_model=H * D, num_heads=H, num_layers=2,
                          mlp_dim=32, encoding='rope', logit_soft_cap=2.0, sinks=True,
                          rngs=nnx.Rngs(0))
    for block in lm.blocks:
      self.assertEqual(block.attention.logit_soft_cap, 2.0)
      block.attention.sink_logits[...] = SINKS
    tokens = jax.random.randint(jax.random.key(2), (B, T), 0, 11)
    cache = lm.init_cache(B, T)
    first, cache = lm.extend(tokens[:, :3], cache, 0)
    rest, _ = lm.extend(tokens[:, 3:], cache, 3)
    chex.assert_trees_all_close(jnp.concatenate([first, rest], 1), lm(tokens), atol=1e-4)

  def test_bad_arguments_are_refused(self):
    build = lambda **kw: aj.MultiHeadAttention(H * D, H, causal=True, rngs=nnx.Rngs(0), **kw)
    with self.assertRaisesRegex(ValueError, 'logit_soft_cap=-1.0: use a positive finite'):
      build(logit_soft_cap=-1.0)
    with self.assertRaisesRegex(TypeError, "sinks='yes': use True"):
      build(sinks='yes')
    with self.assertRaisesRegex(ValueError, "sinks=True: both act on a softmax, not on "
                                "normalization='stick_breaking'"):
      build(sinks=True, normalization='stick_breaking')


if __name__ == '__main__':
  absltest.main()
