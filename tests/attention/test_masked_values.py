"""Keys masked by structure (kv_lengths, causal, window) have no influence on
`scaled_dot_product_attention`, even when their values hold NaN or ±inf: the
outputs and every gradient equal those of the same call with clean values,
on every kernel that runs here (`attention/masked_values.py`). A value a
query does see, non-finite, still makes that output NaN."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import attention_jax as aj

from tests import tiers

B, T, H, D = 2, 8, 2, 4
# (implementation, chunked_strategy, normalization): each kernel path on CPU.
PATHS = (('dense', 'auto', 'softmax'), ('chunked', 'scan', 'softmax'),
         ('chunked', 'unrolled', 'softmax'), ('dense', 'auto', 'stick_breaking'),
         ('chunked', 'auto', 'stick_breaking'))


def _qkv(h_kv=H):
  rng = np.random.default_rng(0)
  return tuple(jnp.asarray(rng.normal(size=(B, T, h, D)), jnp.float32)
               for h in (H, h_kv, h_kv))


def _cases():
  for implementation, strategy, normalization in PATHS:
    for bad in ('nan', 'inf', 'minus_inf'):
      yield (f'_{implementation}_{strategy}_{normalization}_{bad}', implementation, strategy,
             normalization, {'nan': np.nan, 'inf': np.inf, 'minus_inf': -np.inf}[bad])


class MaskedValuesTest(parameterized.TestCase):

  def _attend(self, implementation, strategy, normalization, **options):
    def attend(q, k, v):
      return aj.scaled_dot_product_attention(
          q, k, v, implementation=implementation, chunked_strategy=strategy,
          normalization=normalization, chunk_size=4, **options)
    return attend

  def _assert_no_influence(self, attend, v_bad, rows):
    """Outputs at `rows` (an index into [B, T_q]) and the gradients of their
    sum, with v_bad and with clean v: equal and finite."""
    q, k, v = _qkv()
    loss = lambda q, k, v: jnp.sum(jnp.where(rows[..., None, None], attend(q, k, v), 0.0))
    clean, dirty = attend(q, k, v), attend(q, k, v_bad)
    np.testing.assert_allclose(np.asarray(dirty)[np.asarray(rows)],
                               np.asarray(clean)[np.asarray(rows)], rtol=1e-6, atol=1e-6)
    self.assertTrue(np.isfinite(np.asarray(dirty)[np.asarray(rows)]).all())
    grads = jax.grad(loss, argnums=(0, 1, 2))
    for name, g_clean, g_dirty in zip('qkv', grads(q, k, v), grads(q, k, v_bad)):
      self.assertTrue(np.isfinite(g_dirty).all(), f'd{name} not finite')
      np.testing.assert_allclose(g_dirty, g_clean, rtol=1e-5, atol=1e-6, err_msg=f'd{name}')

  @parameterized.named_parameters(*_cases())
  def test_padded_values_have_no_influence(self, implementation, strategy, normalization,
                                           bad):
    lengths = jnp.array([T, 5])
    attend = self._attend(implementation, strategy, normalization, causal=True,
                          kv_lengths=lengths)
    _, _, v = _qkv()
    # The real queries (a padded query's output is unspecified: stick-breaking's
    # remainder reads the query's own, padded, value).
    rows = jnp.arange(T)[None] < lengths[:, None]
    self._assert_no_influence(attend, v.at[1, 5:].set(bad), rows)

  @parameterized.named_parameters(*_cases())
  @tiers.fast_cases(4)
  def test_future_values_have_no_influence(self, implementation, strategy, normalization,
                                           bad):
    attend = self._attend(implementation, strategy, normalization, causal=True)
    _, _, v = _qkv()
    rows = jnp.broadcast_to(jnp.arange(T) < T - 1, (B, T))
    self._assert_no_influence(attend, v.at[:, T - 1, 0, 1].set(bad), rows)

  @parameterized.named_parameters(
      ('_dense', 'dense', 'auto'), ('_scan', 'chunked', 'scan'),
      ('_unrolled', 'chunked', 'unrolled'))
  def test_values_outside_the_window_have_no_influence(self, implementation, strategy):
    attend = self._attend(implementation, strategy, 'softmax', window=2)
    _, _, v = _qkv()
    # Key 0 is seen by queries 0 and 1 only (|i - j| < 2).
    rows = jnp.broadcast_to(jnp.arange(T) >= 2, (B, T))
    self._assert_no_influence(attend, v.at[:, 0].set(np.nan), rows)

  @parameterized.named_parameters(('_dense', 'dense'), ('_chunked', 'chunked'))
  def test_a_visible_non_finite_value_makes_its_outputs_nan(self, implementation):
    q, k, v = _qkv()
    out = aj.scaled_dot_product_attention(
        q, k, v.at[0, 2, 1, 3].set(np.inf), causal=True, implementation=implementation,
        chunk_size=4)
    nan = np.isnan(np.asarray(out))
    # Feature 3 of head 1 of the queries 2 … T-1 of row 0 see it; nothing else.
    expected = np.zeros_like(nan)
    expected[0, 2:, 1, 3] = True
    np.testing.assert_array_equal(nan, expected)

  def test_grouped_query_heads_see_their_own_values(self):
    q, k, v = _qkv(h_kv=1)
    out = aj.scaled_dot_product_attention(
        q, k, v.at[0, 7].set(np.nan), kv_lengths=jnp.array([6, 8]), implementation='dense')
    self.assertTrue(np.isfinite(np.asarray(out)[0]).all())
    self.assertTrue(np.isnan(np.asarray(out)[1]).sum() == 0)
    out = aj.scaled_dot_product_attention(
        q, k, v.at[1, 7].set(np.nan), kv_lengths=jnp.array([6, 8]), implementation='dense')
    self.assertTrue(np.isnan(np.asarray(out)[1]).all())

  def test_under_jit(self):
    q, k, v = _qkv()
    attend = jax.jit(lambda v, lengths: aj.scaled_dot_product_attention(
        q, k, v, kv_lengths=lengths, implementation='chunked', chunk_size=4))
    lengths = jnp.array([T, 3])
    np.testing.assert_allclose(attend(v.at[1, 3:].set(np.nan), lengths), attend(v, lengths),
                               rtol=1e-6, atol=1e-6)


if __name__ == '__main__':
  absltest.main()
