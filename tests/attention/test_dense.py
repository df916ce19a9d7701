"""Scaled dot-product attention: single head and multi-head."""

import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
import pytest
from absl.testing import parameterized
from jax.test_util import check_grads

import attention_jax as aj
from tests import references as ref

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
# Tolerance of an output computed from inputs rounded to `dtype`.
ATOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2, jnp.float16: 3e-3}


def _random(key, *shapes, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(key), len(shapes))
  return [jax.random.normal(k, s, dtype) for k, s in zip(keys, shapes)]


class LessonExampleTest(absltest.TestCase):
  """Lesson 7.2, steps 3–6, from its score matrix S (see README)."""

  S = np.array([[2.1, 1.4, 0.8], [0.9, 3.2, 1.1], [1.3, 1.7, 2.9]])

  def test_scaled_scores_and_weights(self):
    # With d_k = 3, feed q = S and k = I: then q kᵀ = S exactly.
    q, k = jnp.asarray(self.S, jnp.float32), jnp.eye(3, dtype=jnp.float32)
    v = jnp.asarray([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    out, weights = aj.dot_product_attention(q, k, v)
    # Step 4: the lesson's printed S / √3, to its two decimals.
    np.testing.assert_allclose(
        self.S / np.sqrt(3),
        [[1.21, 0.81, 0.46], [0.52, 1.85, 0.64], [0.75, 0.98, 1.67]], atol=6e-3)
    # Step 5: the true softmax (the lesson prints other numbers; see README).
    expected = np.array([[0.4673, 0.3120, 0.2207],
                         [0.1696, 0.6400, 0.1904],
                         [0.2093, 0.2636, 0.5271]])
    np.testing.assert_allclose(weights, expected, atol=1e-4)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    # Step 6: with V = I, the output rows are the weights themselves.
    np.testing.assert_allclose(out, weights, atol=1e-6)

  def test_lesson_printed_weights_are_not_a_softmax(self):
    # Rows 1 and 2 of the lesson's step 5 sum to 1.27 and 1.30.
    printed = np.array([[0.44, 0.29, 0.27], [0.21, 0.80, 0.26], [0.27, 0.34, 0.69]])
    self.assertGreater(np.abs(printed.sum(-1) - 1).max(), 0.25)


class DotProductAttentionTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(dtype=DTYPES, masked=(False, True), biased=(False, True))
  def test_matches_numpy_reference(self, dtype, masked, biased):
    q, k, v = _random(0, (5, 8), (7, 8), (7, 6))
    bias = _random(1, (5, 7))[0] if biased else None
    mask = jax.random.bernoulli(jax.random.key(2), 0.6, (5, 7)) if masked else None
    qd, kd, vd = (a.astype(dtype) for a in (q, k, v))
    out, weights = self.variant(
        lambda q, k, v: aj.dot_product_attention(q, k, v, mask=mask, bias=bias))(qd, kd, vd)
    chex.assert_shape(out, (5, 6))
    chex.assert_shape(weights, (5, 7))
    self.assertEqual(out.dtype, dtype)
    self.assertEqual(weights.dtype, jnp.float32)
    # The reference sees the same rounded inputs, so only our arithmetic differs.
    want_out, want_w = ref.attention(
        *(np.asarray(a.astype(jnp.float32)) for a in (qd, kd, vd)), mask=mask, bias=bias)
    np.testing.assert_allclose(weights, want_w, atol=ATOL[jnp.float32] if dtype == jnp.float32 else 1e-5)
    np.testing.assert_allclose(np.asarray(out, np.float32), want_out, atol=ATOL[dtype])

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*DTYPES)
  def test_fully_masked_row_is_zero_with_zero_gradients(self, dtype):
    q, k, v = (a.astype(dtype) for a in _random(3, (4, 8), (4, 8), (4, 8)))
    mask = aj.causal_mask(4).at[2].set(False)  # row 2 attends to nothing

    def loss(q, k, v):
      out, _ = aj.dot_product_attention(q, k, v, mask=mask)
      return jnp.sum(out.astype(jnp.float32) ** 2)

    out, weights = self.variant(
        lambda q, k, v: aj.dot_product_attention(q, k, v, mask=mask))(q, k, v)
    np.testing.assert_array_equal(np.asarray(weights[2]), 0.0)
    np.testing.assert_array_equal(np.asarray(out[2], np.float32), 0.0)
    grads = self.variant(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for g in grads:
      chex.assert_tree_all_finite(g)
    np.testing.assert_array_equal(np.asarray(grads[0][2], np.float32), 0.0)

  @parameterized.parameters(*DTYPES)
  def test_large_logits_do_not_overflow(self, dtype):
    big = jnp.finfo(dtype).max / 4
    q = jnp.asarray([[1.0], [-1.0]], dtype) * jnp.asarray(big, dtype)
    k = jnp.asarray([[1.0], [0.5], [-1.0]], dtype) * 4
    v = jnp.eye(3, dtype=dtype)
    out, weights = aj.dot_product_attention(q, k, v)
    chex.assert_tree_all_finite((out, weights))
    np.testing.assert_allclose(weights, [[1, 0, 0], [0, 0, 1]], atol=1e-6)

  @pytest.mark.slow
  def test_gradients_numerically_in_float64(self):
    with jax.enable_x64(True):
      q, k, v = _random(4, (3, 4), (5, 4), (5, 2), dtype=jnp.float64)
      mask = jnp.asarray(np.random.RandomState(0).rand(3, 5) > 0.3)
      bias = _random(5, (3, 5), dtype=jnp.float64)[0]
      f = lambda q, k, v, b: aj.dot_product_attention(q, k, v, mask=mask, bias=b)[0]
      check_grads(f, (q, k, v, bias), order=2, modes=('rev', 'fwd'), atol=1e-6, rtol=1e-6)

  def test_bad_shapes_are_clear_errors(self):
    q, k, v = _random(6, (3, 4), (5, 4), (5, 2))
    with self.assertRaisesRegex(ValueError, r'one head'):
      aj.dot_product_attention(q[None], k, v)
    with self.assertRaisesRegex(ValueError, r'incompatible shapes'):
      aj.dot_product_attention(q, k[:, :3], v)
    with self.assertRaisesRegex(ValueError, r'mask has shape \(3, 4\)'):
      aj.dot_product_attention(q, k, v, mask=jnp.ones((3, 4), bool))
    with self.assertRaisesRegex(TypeError, r'mask must be boolean'):
      aj.dot_product_attention(q, k, v, mask=jnp.ones((3, 5), jnp.int32))


class MultiHeadAttentionTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      ('no_mask', None), ('causal', 'causal'), ('padding', 'padding'),
      ('per_example_per_head', 'full'))
  def test_equals_jax_nn(self, mask_kind):
    b, t, h, d = 3, 6, 4, 8
    q, k, v = _random(7, (b, t, h, d), (b, t, h, d), (b, t, h, d))
    mask = {
        None: None,
        'causal': aj.causal_mask(t),
        'padding': aj.combine_masks(aj.causal_mask(t), aj.padding_mask(jnp.array([6, 3, 1]), t)),
        'full': jax.random.bernoulli(jax.random.key(8), 0.7, (b, h, t, t)) | jnp.eye(t, dtype=bool),
    }[mask_kind]
    out, weights = self.variant(lambda q, k, v: aj.multi_head_attention(q, k, v, mask=mask))(q, k, v)
    chex.assert_shape(out, (b, t, h, d))
    chex.assert_shape(weights, (b, h, t, t))
    jax_mask = None if mask is None else jnp.broadcast_to(mask, (b, h, t, t))
    want = jax.nn.dot_product_attention(q, k, v, mask=jax_mask, implementation='xla')
    if mask_kind == 'padding':  # jax.nn averages V on fully masked rows; we give 0
      valid = np.arange(t)[None, :, None, None] < np.array([6, 3, 1])[:, None, None, None]
      want = jnp.where(valid, want, 0.0)
    chex.assert_trees_all_close(out, want, atol=1e-5, rtol=1e-5)

  def test_per_head_bias_broadcast_without_materialising(self):
    b, t, h, d = 2, 5, 3, 4
    q, k, v = _random(9, (b, t, h, d), (b, t, h, d), (b, t, h, 2))
    bias = aj.positional.alibi_bias(h, t, t)  # [H, T, T], shared by the batch
    out, weights = aj.multi_head_attention(q, k, v, mask=aj.causal_mask(t), bias=bias[None])
    for bi, hi in itertools.product(range(b), range(h)):
      want_out, want_w = ref.attention(q[bi, :, hi], k[bi, :, hi], v[bi, :, hi],
                                       mask=np.tril(np.ones((t, t), bool)), bias=bias[hi])
      np.testing.assert_allclose(out[bi, :, hi], want_out, atol=1e-5)
      np.testing.assert_allclose(weights[bi, hi], want_w, atol=1e-6)

  @parameterized.parameters(*DTYPES)
  def test_dtypes(self, dtype):
    q, k, v = (a.astype(dtype) for a in _random(10, (2, 4, 2, 8), (2, 4, 2, 8), (2, 4, 2, 8)))
    out, weights = aj.multi_head_attention(q, k, v, mask=aj.causal_mask(4))
    self.assertEqual(out.dtype, dtype)
    self.assertEqual(weights.dtype, jnp.float32)
    chex.assert_tree_all_finite(out)

  def test_bad_shapes_are_clear_errors(self):
    q, k, v = _random(11, (2, 4, 2, 8), (2, 4, 2, 8), (2, 4, 2, 8))
    with self.assertRaisesRegex(ValueError, r'\[batch, length, heads, head_dim\]'):
      aj.multi_head_attention(q[0], k, v)
    with self.assertRaisesRegex(ValueError, r'incompatible shapes'):
      aj.multi_head_attention(q, k[:, :, :1], v)
    with self.assertRaisesRegex(ValueError, r'does not broadcast to \(2, 2, 4, 4\)'):
      aj.multi_head_attention(q, k, v, mask=jnp.ones((3, 1, 4, 4), bool))

  def test_rank_3_masks_and_biases_are_refused_as_ambiguous(self):
    # B == H == 2: [2, 4, 4] could be per example or per head.
    q, k, v = _random(12, (2, 4, 2, 8), (2, 4, 2, 8), (2, 4, 2, 8))
    for name in ('mask', 'bias'):
      x = jnp.ones((2, 4, 4), bool if name == 'mask' else jnp.float32)
      for f in (aj.multi_head_attention, aj.scaled_dot_product_attention):
        with self.assertRaisesRegex(ValueError, rf'{name} has shape \(2, 4, 4\).*rank 4 '
                                    rf'\[B\|1, H\|1, T_q, T_k\].*ambiguous'):
          f(q, k, v, **{name: x})


if __name__ == '__main__':
  absltest.main()
