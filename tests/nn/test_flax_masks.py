"""Flax's masks are float32 (`nnx.make_attention_mask`,
`nnx.make_causal_mask`): a concrete one of exact 0s and 1s is served as the
boolean mask it stands for; other values, or a traced float mask (under
`jit` its values cannot be checked), are refused with `.astype(bool)` in
the message."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import attention_jax as aj

B, T, D = 2, 5, 8


def _inputs():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(B, T, D)), jnp.float32)
  tokens = jnp.array([[1, 2, 3, 4, 5], [1, 2, 3, 0, 0]])
  return x, tokens


class FlaxMasksTest(parameterized.TestCase):

  def test_make_causal_mask_is_served_as_causal(self):
    x, tokens = _inputs()
    module = aj.MultiHeadAttention(D, 2, causal=True, rngs=nnx.Rngs(0))
    mask = nnx.make_causal_mask(tokens)
    self.assertEqual(mask.dtype, jnp.float32)
    np.testing.assert_array_equal(module(x, mask=mask), module(x))

  def test_make_attention_mask_equals_its_boolean_form(self):
    x, tokens = _inputs()
    module = aj.MultiHeadAttention(D, 2, causal=False, rngs=nnx.Rngs(0))
    mask = nnx.make_attention_mask(tokens > 0, tokens > 0)
    self.assertEqual(mask.dtype, jnp.float32)
    np.testing.assert_array_equal(module(x, mask=mask), module(x, mask=mask.astype(bool)))
    np.testing.assert_array_equal(
        aj.scaled_dot_product_attention(*(jnp.ones((B, T, 2, 4)),) * 3, mask=mask),
        aj.scaled_dot_product_attention(*(jnp.ones((B, T, 2, 4)),) * 3,
                                        mask=mask.astype(bool)))

  @parameterized.named_parameters(('_half', 0.5), ('_two', 2.0), ('_nan', np.nan))
  def test_other_float_values_are_refused(self, value):
    x, tokens = _inputs()
    module = aj.MultiHeadAttention(D, 2, causal=True, rngs=nnx.Rngs(0))
    mask = nnx.make_causal_mask(tokens).at[0, 0, 0, 0].set(value)
    with self.assertRaisesRegex(ValueError, r'mask is float32 with values other than 0 and 1'
                                r'.*mask\.astype\(bool\)'):
      module(x, mask=mask)

  def test_a_traced_float_mask_is_refused_with_the_conversion(self):
    x, tokens = _inputs()
    module = aj.MultiHeadAttention(D, 2, causal=True, rngs=nnx.Rngs(0))
    call = jax.jit(lambda x, mask: module(x, mask=mask))
    with self.assertRaisesRegex(TypeError, r'mask is a traced float32 array.*'
                                r'mask\.astype\(bool\)'):
      call(x, nnx.make_causal_mask(tokens))
    np.testing.assert_allclose(call(x, nnx.make_causal_mask(tokens).astype(bool)), module(x),
                               rtol=1e-6, atol=1e-6)

  def test_integer_masks_are_refused(self):
    x, tokens = _inputs()
    module = aj.MultiHeadAttention(D, 2, causal=True, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(TypeError, r'mask must be boolean.*mask\.astype\(bool\)'):
      module(x, mask=nnx.make_causal_mask(tokens).astype(jnp.int32))

  def test_a_mask_of_another_length_is_refused_early(self):
    x, _ = _inputs()
    module = aj.MultiHeadAttention(D, 2, causal=True, encoding='alibi', rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r'mask has shape \(1, 1, 6, 6\), which does not '
                                r'broadcast to \(2, 2, 5, 5\)'):
      module(x, mask=jnp.ones((T + 1, T + 1), bool))


if __name__ == '__main__':
  absltest.main()
