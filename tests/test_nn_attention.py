"""NNX attention modules: against Flax and NumPy, causality, errors."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from tests import references as ref

ENCODINGS = sorted(aj.ENCODINGS)


class MultiHeadAttentionModuleTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters(None, 'causal')
  def test_equals_flax_with_the_same_weights(self, mask_kind):
    d_model, heads, t = 32, 4, 7
    ours = aj.MultiHeadAttention(d_model, heads, use_bias=True, rngs=nnx.Rngs(0))
    theirs = nnx.MultiHeadAttention(heads, d_model, decode=False, rngs=nnx.Rngs(1))
    for mine, flax_name in (('W_Q', 'query'), ('W_K', 'key'), ('W_V', 'value'), ('W_O', 'out')):
      src = getattr(theirs, flax_name)
      getattr(ours, mine).kernel[...] = src.kernel[...]
      getattr(ours, mine).bias[...] = src.bias[...]
    x = jax.random.normal(jax.random.key(2), (3, t, d_model))
    mask = None if mask_kind is None else aj.causal_mask(t)
    out, weights = ours(x, mask=mask)
    want = theirs(x, mask=None if mask is None else mask[None, None])
    chex.assert_shape(weights, (3, heads, t, t))
    chex.assert_trees_all_close(out, want, atol=1e-5, rtol=1e-5)

  def test_heads_must_divide_d_model(self):
    with self.assertRaisesRegex(ValueError, 'num_heads=3 must be >= 1 and divide d_model=16'):
      aj.MultiHeadAttention(16, 3, rngs=nnx.Rngs(0))

  def test_bad_input_width(self):
    mha = aj.MultiHeadAttention(16, 4, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r'x must be \[batch, length, 16\], got \(2, 3, 8\)'):
      mha(jnp.zeros((2, 3, 8)))

  def test_cross_attention_shapes(self):
    mha = aj.MultiHeadAttention(16, 4, encoding='rope', rngs=nnx.Rngs(0))
    out, weights = mha(jnp.ones((2, 3, 16)), jnp.ones((2, 9, 16)))
    chex.assert_shape(out, (2, 3, 16))
    chex.assert_shape(weights, (2, 4, 3, 9))

  def test_rope_rotates_q_and_k_inside(self):
    mha = aj.MultiHeadAttention(16, 2, encoding='rope', rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(3), (1, 5, 16))
    _, weights = mha(x)
    q = aj.positional.apply_rope(mha.W_Q(x), np.arange(5))
    k = aj.positional.apply_rope(mha.W_K(x), np.arange(5))
    _, want = aj.multi_head_attention(q, k, mha.W_V(x))
    chex.assert_trees_all_close(weights, want, atol=1e-6)
    # Shifting every position by the same offset changes nothing.
    _, shifted = mha(x, positions=np.arange(5) + 20_000)
    chex.assert_trees_all_close(shifted, weights, atol=1e-5)

  @parameterized.product(dtype=(jnp.float32, jnp.bfloat16, jnp.float16), encoding=ENCODINGS)
  def test_dtypes(self, dtype, encoding):
    mha = aj.MultiHeadAttention(16, 4, encoding=encoding, max_positions=8, dtype=dtype,
                                rngs=nnx.Rngs(0))
    out, weights = nnx.jit(lambda m, x: m(x, mask=aj.causal_mask(6)))(mha, jnp.ones((2, 6, 16), dtype))
    self.assertEqual(out.dtype, dtype)
    self.assertEqual(weights.dtype, jnp.float32)
    chex.assert_tree_all_finite((out, weights))


class SelfAttentionModuleTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_the_lesson_formula(self):
    attn = aj.SelfAttention(d_model=8, d_k=4, d_v=3, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(4), (2, 5, 8))
    mask = aj.causal_mask(5)
    out, weights = self.variant(lambda x: attn(x, mask=mask))(x)
    chex.assert_shape(out, (2, 5, 3))
    chex.assert_shape(weights, (2, 5, 5))
    for b in range(2):
      q, k, v = (np.asarray(w(x)[b]) for w in (attn.W_Q, attn.W_K, attn.W_V))
      want_out, want_w = ref.attention(q, k, v, mask=np.asarray(mask))
      np.testing.assert_allclose(out[b], want_out, atol=1e-5)
      np.testing.assert_allclose(weights[b], want_w, atol=1e-6)

  def test_lesson_shapes(self):
    attn = aj.SelfAttention(d_model=64, d_k=32, rngs=nnx.Rngs(0))
    out, weights = attn(jnp.ones((4, 10, 64)))
    chex.assert_shape(out, (4, 10, 32))
    chex.assert_shape(weights, (4, 10, 10))
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)


class CausalityTest(parameterized.TestCase):
  """The output at t must not depend on inputs after t, whatever the encoding."""

  @parameterized.parameters(*ENCODINGS)
  def test_no_gradient_from_the_future(self, encoding):
    t, d = 6, 16
    enc = aj.make_encoding(encoding, d_model=d, num_heads=4, max_positions=t, rngs=nnx.Rngs(0))
    mha = aj.MultiHeadAttention(d, 4, encoding=enc, rngs=nnx.Rngs(1))
    x = jax.random.normal(jax.random.key(5), (1, t, d))

    def output_at(x, i):
      h = enc.add_to_embeddings(x, np.arange(t))
      out, _ = mha(h, mask=aj.causal_mask(t))
      return jnp.sum(out[0, i])

    for i in range(t):
      grad = jax.grad(output_at)(x, i)[0]  # [T, D]
      norms = jnp.linalg.norm(grad, axis=-1)
      np.testing.assert_array_equal(norms[i + 1:], 0.0)
      self.assertGreater(float(norms[i]), 0.0)  # the test can see a dependence


class LinenBridgeTest(absltest.TestCase):

  def test_usable_from_linen(self):
    from flax.nnx import bridge  # pylint: disable=g-import-not-at-top
    layer = bridge.to_linen(aj.MultiHeadAttention, 16, 4, encoding='alibi')
    x = jnp.ones((2, 5, 16))
    variables = layer.init(jax.random.key(0), x)
    out, weights = layer.apply(variables, x)
    chex.assert_shape(out, (2, 5, 16))
    chex.assert_shape(weights, (2, 4, 5, 5))


if __name__ == '__main__':
  absltest.main()
