"""The encodings research compares with the classic four: T5 bias, KERPLE,
randomized positions, and RoPE context extension (PI, NTK-aware, YaRN)."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
import pytest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax import positional as pe
from attention_jax.lab import tasks
from attention_jax.lab.evaluate import rope_scaled
from configs import copy as copy_config


def _t5_bucket_reference(i, j, causal, num_buckets=32, max_distance=128):
  """T5's bucketing, written out for one pair from the paper's description."""
  n = i - j  # how far the key lies before the query
  offset = 0
  if causal:
    n = max(n, 0)
  else:
    num_buckets //= 2
    if n < 0:
      offset, n = num_buckets, -n
  exact = num_buckets // 2
  if n < exact:
    return offset + n
  large = exact + int(math.log(n / exact) / math.log(max_distance / exact)
                      * (num_buckets - exact))
  return offset + min(large, num_buckets - 1)


class T5BiasTest(parameterized.TestCase):

  @parameterized.parameters(True, False)
  def test_buckets_match_the_reference(self, causal):
    q = np.arange(0, 600, 7)
    k = np.arange(0, 600, 5)
    got = np.asarray(pe.relative_position_bucket(q, k, causal=causal))
    want = np.array([[_t5_bucket_reference(i, j, causal) for j in k] for i in q])
    np.testing.assert_array_equal(got, want)
    self.assertEqual(got.max(), 31)  # far distances share the last bucket

  def test_bias_is_the_table_at_the_bucket_per_head(self):
    enc = aj.make_encoding('t5', d_model=16, num_heads=2, rngs=nnx.Rngs(0))
    bias = enc.attention_bias(np.arange(5), np.arange(5))
    chex.assert_shape(bias, (1, 2, 5, 5))  # rank 4: [1, H, T_q, T_k]
    table = np.asarray(enc.table[...])
    np.testing.assert_allclose(bias[0, 1, 4, 1], table[3, 1])
    batched = enc.attention_bias(np.arange(10).reshape(2, 5), np.arange(10).reshape(2, 5))
    chex.assert_shape(batched, (2, 2, 5, 5))

  def test_table_learns(self):
    mha = aj.MultiHeadAttention(16, 2, causal=True, encoding='t5', rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (1, 6, 16))
    grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(mha)
    self.assertGreater(float(jnp.abs(grads.positional.table[...]).sum()), 0.0)


class KerpleTest(absltest.TestCase):

  def test_initial_bias_is_minus_log_one_plus_distance(self):
    enc = aj.make_encoding('kerple', d_model=16, num_heads=2)
    bias = enc.attention_bias(np.arange(6), np.arange(6))
    want = -np.log1p(np.abs(np.arange(6)[:, None] - np.arange(6)[None, :]))
    np.testing.assert_allclose(bias, np.broadcast_to(want, (1, 2, 6, 6)), atol=1e-6)

  def test_both_parameters_learn_and_stay_positive(self):
    mha = aj.MultiHeadAttention(16, 2, causal=True, encoding='kerple', rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (1, 6, 16))
    grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(mha)
    for name in ('raw_r1', 'raw_r2'):
      self.assertGreater(float(jnp.abs(getattr(grads.positional, name)[...]).sum()), 0.0)
    mha.positional.raw_r1[...] = jnp.full((2,), -50.0)  # softplus keeps r1 > 0
    self.assertTrue(np.all(np.asarray(mha.positional.attention_bias(
        np.arange(3), np.arange(3)))[0, :, 2, 0] < 0))


class RopeScalingTest(parameterized.TestCase):

  def test_pi_rotates_position_m_like_plain_rope_at_m_over_s(self):
    x = jax.random.normal(jax.random.key(0), (1, 6, 2, 16))
    freqs, mult = pe.scaled_rope_frequencies(16, 10000.0, pe.RopeScaling('pi', 4.0))
    self.assertEqual(mult, 1.0)
    got = pe.apply_rope(x, 4 * np.arange(6), frequencies=freqs)
    chex.assert_trees_all_close(got, pe.apply_rope(x, np.arange(6)), atol=1e-5)

  def test_ntk_keeps_the_fastest_and_interpolates_the_slowest_frequency(self):
    plain = pe.rope_frequencies(16)
    ntk, _ = pe.scaled_rope_frequencies(16, 10000.0, pe.RopeScaling('ntk', 8.0))
    np.testing.assert_allclose(ntk[0], plain[0])
    np.testing.assert_allclose(ntk[-1], plain[-1] / 8.0, rtol=1e-12)

  def test_rope_scaled_sets_and_restores_every_layer(self):
    model = aj.TransformerLM(vocab_size=8, d_model=16, num_heads=2, num_layers=2, mlp_dim=16,
                             encoding='rope', max_positions=None, rngs=nnx.Rngs(0))
    tokens = jnp.arange(12)[None] % 8
    plain = model(tokens)
    with rope_scaled(model, pe.RopeScaling('pi', 2.0)):
      scaled = model(tokens)
      self.assertTrue(all(b.attention.positional.scaling.method == 'pi' for b in model.blocks))
    self.assertGreater(float(jnp.abs(scaled - plain).max()), 1e-3)
    chex.assert_trees_all_close(model(tokens), plain)
    alibi = aj.TransformerLM(vocab_size=8, d_model=16, num_heads=2, num_layers=1, mlp_dim=16,
                             encoding='alibi', max_positions=None, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, "RoPE scaling 'pi' asked for a model without RoPE"):
      with rope_scaled(alibi, pe.RopeScaling('pi', 2.0)):
        pass


class RandomizedPositionsTest(parameterized.TestCase):

  def test_sorted_distinct_in_range_and_reproducible(self):
    p = np.asarray(pe.random_positions(jax.random.key(0), 64, 20, 50))
    self.assertTrue(np.all(np.diff(p, axis=1) > 0))
    self.assertTrue(p.min() >= 0 and p.max() < 50)
    self.assertGreater(p.max(), 40)  # far positions are actually drawn
    np.testing.assert_array_equal(p, pe.random_positions(jax.random.key(0), 64, 20, 50))
    with self.assertRaisesRegex(ValueError, 'max_position must be >= the sequence length 20'):
      pe.random_positions(jax.random.key(0), 1, 20, 10)

  def test_training_batch_keeps_its_tokens_and_gains_positions(self):
    kw = dict(batch_size=4, min_length=1, max_length=5, vocab_size=8)
    task = tasks.get_task('copy')
    plain = tasks.train_batch(task, 0, jnp.int32(3), **kw)
    randomized = tasks.train_batch(task, 0, jnp.int32(3), max_position=40, **kw)
    np.testing.assert_array_equal(plain['inputs'], randomized['inputs'])
    self.assertNotIn('positions', plain)
    chex.assert_shape(randomized['positions'], plain['inputs'].shape)

  def test_config_spec_and_validation(self):
    c = copy_config.get_config('encoding=learned:randomized,scale=tiny')
    self.assertEqual(c.model.encoding, 'learned:randomized')
    c.positions.max_position = 10  # below the 18 positions read at eval.max_length=8
    from attention_jax.lab.config.validate import validate_config  # pylint: disable=g-import-not-at-top
    with self.assertRaisesRegex(ValueError, 'positions.max_position=10 is below the 18 positions'):
      validate_config(c)

  @parameterized.parameters('random', 'contiguous')
  @pytest.mark.slow
  def test_evaluation_positions(self, mode):
    """Randomized models are evaluated on random positions (as trained) or on
    0 … T-1 (the draw itself is tested for reproducibility above)."""
    from attention_jax.lab.runs.one_run import run_one  # pylint: disable=g-import-not-at-top
    import tempfile  # pylint: disable=g-import-not-at-top
    c = copy_config.get_config('encoding=learned:randomized,scale=tiny')
    c.positions.randomized_eval = mode
    rows = run_one(c, tempfile.mkdtemp())
    self.assertEqual([r['length'] for r in rows], [1, 2, 3, 4, 5, 6, 8])  # the tiny grid
    self.assertEqual({r['encoding'] for r in rows}, {'learned:randomized'})


if __name__ == '__main__':
  absltest.main()
