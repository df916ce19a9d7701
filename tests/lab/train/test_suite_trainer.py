"""The suite trainer's length buckets and the hard set's padding: each
changes what a step or an evaluation costs, never what it computes."""

from unittest import mock

import chex
import numpy as np
import pytest
from absl.testing import absltest

from attention_jax.lab import tasks as lab_tasks
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.config import suite_config
from attention_jax.lab.train import suite_programs
from attention_jax.lab.train import suite_trainer
from tests.lab.runs.test_suite import tiny


class LengthBucketsTest(chex.TestCase):
  """train.length_buckets: each step at its length's bucket, the padding
  inert: the same training as one bucket to float rounding (dropout off)."""

  def _train(self, buckets):
    c = tiny(**{'model.dropout': 0.0, 'train.length_buckets': buckets,
                'train.num_steps': 8, 'train.steps_per_call': 4})
    group = [lab_tasks.get_spec('reverse_string'), lab_tasks.get_spec('odds_first')]
    programs = suite_programs.Programs.for_tasks(c, group)
    _, params, _, log = suite_trainer.train(programs, group, 'relative:randomized', [0, 1],
                                            1e-3, progress=lambda _: None)
    return params, log

  def _assert_trains_as_one_bucket(self, buckets):
    one_params, one_log = self._train(1)
    params, log = self._train(buckets)
    chex.assert_trees_all_close(params, one_params, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose([r['loss'] for r in log['log']],
                               [r['loss'] for r in one_log['log']], rtol=1e-5)

  def test_buckets_train_as_one_bucket(self):
    self._assert_trains_as_one_bucket(2)

  @pytest.mark.slow
  def test_four_buckets_train_as_one_bucket(self):  # one bucket per length
    self._assert_trains_as_one_bucket(4)

  def test_bucket_ends_and_slots(self):
    c = tiny(**{'train.length_buckets': 2})  # lengths 1–4
    self.assertEqual(suite_programs.bucket_ends(c), [2, 4])
    self.assertEqual(suite_programs.bucket_ends(tiny()), [4])
    group = [lab_tasks.get_spec('reverse_string')]  # n inputs, n outputs
    self.assertEqual(suite_programs.bucket_slots(group, [2, 4]), (4, 8))

  def test_length_buckets_checked_and_only_a_bucketed_config_records_them(self):
    for value in (-1, 5):
      with self.assertRaisesRegex(ConfigError, f'train.length_buckets={value} must be an '
                                  'integer from 0 \\(none\\) to 4'):
        suite_config.validate(tiny(**{'train.length_buckets': value}))
    self.assertNotIn('length_buckets', suite_config.identity(tiny())['train'])
    self.assertEqual(suite_config.identity(tiny(**{'train.length_buckets': 2}))['train']
                     ['length_buckets'], 2)


class HardSetPaddingTest(chex.TestCase):
  """The hard set's cases are padded to `suite_hard.ROWS` rows so lengths
  share a compiled program; the padding changes no scored row, with dropout
  on and randomized positions (both drawn per batch or per row)."""

  def test_hard_set_padding_changes_no_scored_row(self):
    from attention_jax.lab.evaluate import suite_hard  # pylint: disable=import-outside-toplevel
    c = tiny(**{'model.dropout': 0.5, 'eval.deterministic': False})
    task = lab_tasks.get_spec('bucket_sort')
    rows = {}
    for pad in (1, suite_hard.ROWS):
      programs = suite_programs.Programs.for_tasks(c, [task])
      graphdef, params, rest = programs.models('relative:randomized', [0, 1])
      with mock.patch.object(suite_hard, 'ROWS', pad):
        rows[pad] = suite_hard.evaluate(programs, task, 'relative:randomized', graphdef,
                                        params, rest)
    self.assertEqual(rows[1], rows[suite_hard.ROWS])
    self.assertGreater(sum(r['count'] for r in rows[1][0]), 0)


if __name__ == '__main__':
  absltest.main()
