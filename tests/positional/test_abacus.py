"""Abacus embeddings: the ids against a NumPy transcription of the official
helper (mcleish7/arithmetic abacus.py), offsets, the table's range, and a
TransformerLM with them (cached decoding equal to the full pass)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.nn.decoding import generate
from attention_jax.nn.decoding import greedy_predictions
from attention_jax.positional.abacus import offset_ids
from attention_jax.positional.abacus import sample_offset

DIGITS = tuple(range(4, 14))


def official_helper(mask: np.ndarray) -> np.ndarray:
  """`Abacus.helper` step by step in NumPy (cumsum of run starts, the start's
  index scattered per segment, index - start + 1, times the mask)."""
  b, t = mask.shape
  shifted = np.concatenate([np.zeros((b, 1), mask.dtype), mask[:, :-1]], axis=1)
  starts = (shifted != mask) & mask
  segment_ids = np.cumsum(starts, axis=1)
  index = np.tile(np.arange(t), (b, 1))
  # scatter_add into a [b, t] tensor; a segment id can reach t only for an
  # all-digit row of length 1, which the draws below avoid.
  reset = np.zeros((b, t + 1), np.int64)
  for r in range(b):
    np.add.at(reset[r], segment_ids[r], index[r] * starts[r])
  positions = index - np.take_along_axis(reset, segment_ids, axis=1) + 1
  return positions * mask


class AbacusIdsTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters(0, 1, 2, 3)
  def test_equal_to_the_official_helper(self, seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 16, (6, 23))
    mask = np.isin(tokens, DIGITS)
    np.testing.assert_array_equal(aj.positional.abacus_ids(tokens, DIGITS),
                                  official_helper(mask))

  def test_by_hand(self):
    # BOS 1 2 3 + 4 5 = 5 7 3 EOS: each number counts from 1.
    tokens = jnp.array([[1, 5, 6, 7, 14, 8, 9, 3, 9, 11, 7, 2]])
    np.testing.assert_array_equal(aj.positional.abacus_ids(tokens, DIGITS),
                                  [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 0]])

  @parameterized.parameters(1, 4, 7, 12)
  def test_chunks_continue_the_run(self, split):
    tokens = jnp.asarray(np.random.default_rng(5).integers(3, 15, (4, 16)))
    full = aj.positional.abacus_ids(tokens, DIGITS)
    head = aj.positional.abacus_ids(tokens[:, :split], DIGITS)
    tail = aj.positional.abacus_ids(tokens[:, split:], DIGITS, previous_run=head[:, -1])
    np.testing.assert_array_equal(jnp.concatenate([head, tail], 1), full)

  def test_offset_moves_digits_only(self):
    ids = jnp.array([[0, 1, 2, 0, 1], [1, 0, 0, 1, 2]])
    np.testing.assert_array_equal(offset_ids(ids, jnp.array([3, 10])),
                                  [[0, 4, 5, 0, 4], [11, 0, 0, 11, 12]])

  def test_sample_offset_one_k_per_batch_in_range(self):
    ks = np.stack([sample_offset(jax.random.key(i), 5, 3) for i in range(60)])
    self.assertTrue(np.all(ks == ks[:, :1]))
    self.assertEqual(set(ks[:, 0].tolist()), set(range(6)))


class AbacusModuleTest(chex.TestCase, parameterized.TestCase):

  def _abacus(self, **kw):
    return aj.positional.Abacus(DIGITS, kw.pop('rows', 6), 4, rngs=nnx.Rngs(0), **kw)

  def test_adds_the_rows_of_the_ids(self):
    abacus = self._abacus()
    tokens = jnp.array([[1, 5, 6, 14, 7]])
    out = abacus(jnp.zeros((1, 5, 4)), abacus.ids(tokens))
    table = abacus.table[...]
    chex.assert_trees_all_close(out[0], table[jnp.array([0, 1, 2, 0, 1])])

  def test_dtype_follows_the_embeddings(self):
    abacus = self._abacus()
    out = abacus(jnp.zeros((1, 2, 4), jnp.bfloat16), jnp.array([[0, 1]]))
    self.assertEqual(out.dtype, jnp.bfloat16)

  def test_past_the_table_static_error(self):
    abacus = self._abacus(rows=4)
    with self.assertRaisesRegex(ValueError, r'ids reach 4 .*4 rows \(ids 0 … 3\)'):
      abacus.ids(jnp.array([[5, 5, 5, 5]]))
    with self.assertRaisesRegex(ValueError, r'ids reach 5'):
      abacus.ids(jnp.array([[5, 5, 3]]), offset=3)

  def test_traced_past_the_table_fails_at_run_time(self):
    abacus = self._abacus(rows=4)
    f = nnx.jit(lambda a, t: a.ids(t))
    f(abacus, jnp.array([[5, 5, 5, 3]])).block_until_ready()
    with self.assertRaisesRegex(Exception, r'ids reach 4'):
      f(abacus, jnp.array([[5, 5, 5, 5]])).block_until_ready()

  @parameterized.named_parameters(
      ('nine_digits', dict(digit_tokens=tuple(range(9))), r'10 distinct token ids'),
      ('one_row', dict(rows=1), r'abacus_embeddings=1 must be an integer >= 2'),
      ('k_past_table', dict(rows=6, max_k=5), r'abacus_max_k=5 must be an integer in 0 … 4'))
  def test_bad_arguments_named(self, kw, message):
    args = dict(digit_tokens=DIGITS, rows=6, d_model=4, max_k=0)
    args.update(kw)
    with self.assertRaisesRegex(ValueError, message):
      aj.positional.Abacus(rngs=nnx.Rngs(0), **args)


class AbacusTransformerTest(chex.TestCase, parameterized.TestCase):

  def _lm(self, encoding='none'):
    return aj.TransformerLM(vocab_size=16, d_model=32, num_heads=4, num_layers=2, mlp_dim=64,
                            encoding=encoding, abacus=dict(digit_tokens=DIGITS, rows=24, max_k=4),
                            rngs=nnx.Rngs(1))

  def _tokens(self):
    return jnp.asarray(np.random.default_rng(2).integers(1, 16, (3, 14)))

  @parameterized.parameters('none', 'rope', 'fire')
  def test_cached_decoding_equals_the_full_pass(self, encoding):
    lm, tokens = self._lm(encoding), self._tokens()
    full = lm(tokens)
    cache, steps = lm.init_cache(3, 14), []
    for i in range(0, 14, 3):  # chunks of 3 across number boundaries
      logits, cache = lm.extend(tokens[:, i:i + 3], cache, i)
      steps.append(logits)
    chex.assert_trees_all_close(jnp.concatenate(steps, 1), full, atol=2e-5)

  def test_generate_equals_rerunning_the_model(self):
    lm = self._lm('rope')
    prompt = jnp.array([[1, 5, 6, 7, 14, 8]])
    out = generate(lm, prompt, 6)
    # Causal: one full pass over the output gives every step's re-run prediction.
    rerun = jnp.argmax(lm(out)[:, prompt.shape[1] - 1:-1], -1)
    np.testing.assert_array_equal(out[:, prompt.shape[1]:], rerun)

  def test_greedy_predictions_under_teacher_forcing(self):
    lm, tokens = self._lm('rope'), self._tokens()
    # A prompt as long as the row: every position reads the row's own token.
    got = greedy_predictions(lm, tokens, jnp.full((3,), 14, jnp.int32))
    np.testing.assert_array_equal(got, jnp.argmax(lm(tokens), -1))

  def test_offset_changes_only_with_digits(self):
    lm = self._lm()
    digits, none = jnp.array([[1, 5, 6, 2]]), jnp.array([[1, 14, 3, 2]])
    self.assertGreater(float(jnp.abs(lm(digits, abacus_offset=2) - lm(digits)).max()), 1e-3)
    chex.assert_trees_all_close(lm(none, abacus_offset=2), lm(none))

  def test_offset_without_abacus_refused(self):
    lm = aj.TransformerLM(vocab_size=16, d_model=8, num_heads=2, num_layers=1, mlp_dim=8,
                          rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r'abacus_offset was given but the model has no'):
      lm(jnp.array([[1, 2]]), abacus_offset=1)

  def test_parameters_at_abacus_table(self):
    state = nnx.state(self._lm(), nnx.Param)
    self.assertEqual(state['abacus']['table'][...].shape, (24, 32))


if __name__ == '__main__':
  absltest.main()
