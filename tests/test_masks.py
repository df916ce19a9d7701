"""Mask helpers."""

import chex
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

import attention_jax as aj


class MasksTest(absltest.TestCase):

  def test_causal(self):
    np.testing.assert_array_equal(aj.causal_mask(3), [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    with self.assertRaisesRegex(ValueError, 'length must be >= 1, got 0'):
      aj.causal_mask(0)

  def test_padding_from_lengths(self):
    mask = aj.padding_mask(jnp.array([2, 3]), 3)
    chex.assert_shape(mask, (2, 1, 3, 3))
    np.testing.assert_array_equal(mask[0, 0], [[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    np.testing.assert_array_equal(mask[1, 0], np.ones((3, 3)))
    with self.assertRaisesRegex(ValueError, r'integer vector \[batch\], got float32\[2\]'):
      aj.padding_mask(jnp.array([2.0, 3.0]), 3)

  def test_padding_from_token_mask_equals_lengths(self):
    tokens = jnp.array([[True, True, False], [True, True, True]])
    np.testing.assert_array_equal(aj.attention_mask_from_tokens(tokens),
                                  aj.padding_mask(jnp.array([2, 3]), 3))

  def test_combine(self):
    combined = aj.combine_masks(aj.causal_mask(3), None, aj.padding_mask(jnp.array([2]), 3))
    np.testing.assert_array_equal(combined[0, 0], [[1, 0, 0], [1, 1, 0], [0, 0, 0]])
    self.assertIsNone(aj.combine_masks(None, None))
    with self.assertRaisesRegex(TypeError, 'masks must be boolean'):
      aj.combine_masks(jnp.ones((2, 2)))


if __name__ == '__main__':
  absltest.main()
