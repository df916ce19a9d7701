"""The task's own ceiling (k-gram ambiguity) and the sorting of failures."""

import dataclasses
import itertools

import chex
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab import tasks
from attention_jax.lab.evaluate import ambiguity
from attention_jax.lab.evaluate import lengths as lengths_module
from attention_jax.lab.evaluate.lengths import evaluation_strings

B, S, E = tasks.BOS, tasks.SEP, tasks.EOS


def _example(x, task='copy'):
  """One decoder-only example of `x` (symbols >= NUM_SPECIAL), unpadded."""
  y = {'copy': x, 'reverse': x[::-1], 'duplicate': x + x}[task]
  tokens = [B, *x, S, *y, E]
  n = len(x)
  mask = [False] * (n + 1) + [True] * (len(y) + 1)
  return (np.array([tokens[:-1]]), np.array([tokens[1:]]), np.array([mask]))


def _repeats_a_k_gram(x, k):
  grams = [tuple(x[i:i + k]) for i in range(len(x) - k + 1)]
  return len(grams) != len(set(grams))


class CeilingTest(chex.TestCase, parameterized.TestCase):

  @parameterized.product(task=('copy', 'reverse'), k=(1, 2, 3))
  def test_copy_and_reverse_are_ambiguous_exactly_when_a_k_gram_repeats(self, task, k):
    # Every string of length 5 over 3 symbols: the definition (no context of k
    # tokens before two outputs with different targets) against its closed form.
    for x in itertools.product((4, 5, 6), repeat=5):
      ok = ambiguity.unambiguous(*_example(list(x), task), ks=(k,))[0, 0]
      self.assertEqual(ok, not _repeats_a_k_gram(x, k), (x, k))

  def test_duplicate_is_ambiguous_up_to_its_length(self):
    # x's last k-gram ends both copies: before x_1 once, before EOS once.
    x = [4, 5, 6, 7]
    got = ambiguity.unambiguous(*_example(x, 'duplicate'), ks=(1, 2, 3, 4, 5))[0]
    np.testing.assert_array_equal(got, [False, False, False, False, True])

  def test_padding_is_not_part_of_any_context(self):
    inputs, targets, mask = _example([4, 5, 4, 6])  # the 1-gram 4 repeats
    padded = [np.pad(a, ((0, 0), (0, 5))) for a in (inputs, targets, mask)]
    np.testing.assert_array_equal(ambiguity.unambiguous(*padded, ks=(1, 2)),
                                  ambiguity.unambiguous(inputs, targets, mask, ks=(1, 2)))
    np.testing.assert_array_equal(ambiguity.unambiguous(inputs, targets, mask, ks=(1, 2)),
                                  [[False, True]])

  def test_ceiling_matches_a_direct_count_on_the_evaluation_strings(self):
    task = tasks.get_task('copy')
    strings = evaluation_strings(task, [3, 12], train_max=4, num_samples=64, vocab_size=4,
                                 batch_size=32)
    rows = ambiguity.ceiling_rows(task, [3, 12], train_max=4, num_samples=64, vocab_size=4,
                                  batch_size=32, ks=(2, 3))
    for n, s in strings.items():
      xs = [row[1:n + 1] for row in s['inputs']]
      for k in (2, 3):
        want = np.mean([not _repeats_a_k_gram(list(x), k) for x in xs])
        got, = [r['unambiguous'] for r in rows if r['length'] == n and r['k'] == k]
        self.assertAlmostEqual(got, want, msg=(n, k))
    # Shorter strings repeat less: the ceiling falls with length.
    at = {(r['length'], r['k']): r['unambiguous'] for r in rows}
    self.assertGreater(at[(3, 2)], at[(12, 2)])


class EvaluationStringsTest(absltest.TestCase):

  def test_the_strings_are_the_batches_make_batch_builds(self):
    """Built in one compiled program per bucket: the same tokens as
    `make_batch` called op by op, coupled positions included."""
    for task, lengths in ((tasks.get_task('copy'), [3, 6]),
                          (dataclasses.replace(tasks.get_task('addition'),
                                               coupled_max_position=20), [2, 5])):
      strings = evaluation_strings(task, lengths, train_max=4, num_samples=8, vocab_size=4,
                                   batch_size=4)
      for n in lengths:
        bucket, = [b for b, ns in lengths_module.buckets(lengths, 4).items() if n in ns]
        keys = lengths_module.evaluation_keys(12345, n, 2)
        direct = [tasks.make_batch(task, k, task.fixed_lengths(n, 4), vocab_size=4,
                                   max_input_length=bucket) for k in keys]
        for name in strings[n]:
          np.testing.assert_array_equal(
              strings[n][name], np.concatenate([np.asarray(d[name]) for d in direct]))


class FirstErrorsTest(chex.TestCase):

  def _sort(self, x, predicted_outputs):
    inputs, targets, mask = _example(x)
    predictions = targets.copy()
    predictions[0, len(x) + 1:] = predicted_outputs
    return ambiguity.first_errors(inputs, targets, mask, predictions, eos=E)[0]

  def test_exact(self):
    x = [4, 5, 6]
    self.assertEqual(self._sort(x, x + [E]), dict(exact=True, category=None, position=None, k=0))

  def test_ambiguity_is_the_successor_of_a_repeated_k_gram(self):
    # x = a b c a b d: after writing "a b" the second time, "c" follows the
    # earlier "a b" (a repeated 2-gram); the model wrote it instead of "d".
    x = [4, 5, 6, 4, 5, 7]
    got = self._sort(x, [4, 5, 6, 4, 5, 6, 7])
    self.assertEqual(got['category'], 'ambiguity')
    self.assertEqual(got['position'], len(x) + 1 + 5)
    self.assertEqual(got['k'], 2)  # "c a b" and "BOS a b" / "SEP a b" share "a b"

  def test_early_and_missed_eos_and_drift(self):
    x = [4, 5, 6, 7]
    self.assertEqual(self._sort(x, [4, 5, E, 7, E])['category'], 'early EOS')
    self.assertEqual(self._sort(x, [4, 5, 6, 7, 7])['category'], 'missed EOS')
    drift = self._sort(x, [4, 5, 9, 7, E])  # 9 follows no earlier "4 5"
    self.assertEqual((drift['category'], drift['k']), ('drift', 0))

  def test_summary_fractions_sum_to_one(self):
    errors = [dict(exact=True, category=None, position=None, k=0),
              dict(exact=False, category='ambiguity', position=3, k=2),
              dict(exact=False, category='ambiguity', position=5, k=4),
              dict(exact=False, category='drift', position=5, k=0)]
    got = ambiguity.failure_summary(errors)
    self.assertAlmostEqual(sum(got[c] for c in ('exact',) + ambiguity.CATEGORIES), 1.0)
    self.assertEqual((got['ambiguity'], got['mean_k_ambiguity']), (0.5, 3.0))


if __name__ == '__main__':
  absltest.main()
