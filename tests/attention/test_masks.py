"""Mask helpers."""

import chex
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

import attention_jax as aj


class MasksTest(absltest.TestCase):

  def test_causal(self):
    np.testing.assert_array_equal(aj.causal_mask(3), [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    with self.assertRaisesRegex(ValueError, 'length=0 must be an integer >= 1'):
      aj.causal_mask(0)

  def test_padding_from_lengths(self):
    mask = aj.padding_mask(jnp.array([2, 3]), 3)
    chex.assert_shape(mask, (2, 1, 3, 3))
    np.testing.assert_array_equal(mask[0, 0], [[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    np.testing.assert_array_equal(mask[1, 0], np.ones((3, 3)))
    with self.assertRaisesRegex(TypeError, r'lengths must be an integer array, got float32'):
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
      aj.combine_masks(jnp.ones((2, 2), jnp.int32))


  def test_relative_distance(self):
    np.testing.assert_array_equal(aj.relative_distance(np.arange(3), np.arange(2) + 1),
                                  [[-1, -2], [0, -1], [1, 0]])
    chex.assert_shape(aj.relative_distance(np.zeros((4, 3), int), np.arange(5)), (4, 3, 5))

  def test_structural_mask_is_the_dense_form_of_the_structure(self):
    self.assertIsNone(aj.attention.structural_mask(3, 3))
    got = aj.attention.structural_mask(4, 4, causal=True, window=2,
                                       kv_lengths=jnp.array([4, 2]))
    chex.assert_shape(got, (2, 1, 4, 4))
    band = np.asarray(aj.causal_mask(4) & aj.sliding_window_mask(4, 4, 2))
    np.testing.assert_array_equal(got[0, 0], band)
    np.testing.assert_array_equal(got[1, 0], band & (np.arange(4) < 2)[None, :])


if __name__ == '__main__':
  absltest.main()
