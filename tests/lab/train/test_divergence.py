"""A diverged run (non-finite training loss) is stopped, marked and left
out of every mean, in the decoder study and in the suite: never read as a
model that failed to extrapolate."""

import json
import os
import tempfile

import numpy as np
from absl.testing import absltest

from attention_jax.lab.report import result_files
from attention_jax.lab.report import results
from attention_jax.lab.protocols import encoder
from attention_jax.lab.report import suite_report
from attention_jax.lab.train import suite_trainer
from attention_jax.lab.train import divergence
from attention_jax.lab.train import loop
from configs import copy as copy_config


def _row(seed, length, accuracy, diverged_at=None):
  return dict(task='copy', encoding='rope', seed=seed, length=length, token_accuracy=accuracy,
              exact_match=accuracy, config_hash='abc', version='0', diverged_at=diverged_at)


class DivergedRowsTest(absltest.TestCase):

  def test_summary_leaves_diverged_seed_out_of_mean_and_counts_it(self):
    rows = [_row(s, n, 0.9) for s in (0, 1) for n in (1, 2, 4, 8)]
    rows += [_row(2, n, 0.0, diverged_at=40) for n in (1, 2, 4, 8)]
    text = results.summary_markdown(rows, 1, 2)
    self.assertIn('| rope | 2 of 3; 1 diverged at step 40 | 90.0 ± 0.0, worst 90.0 |', text)
    self.assertIn('**1 run diverged**', text)
    self.assertIn('copy rope seed 2 at step 40', text)

  def test_all_seeds_diverged_shows_no_mean(self):
    rows = [_row(s, n, 0.0, diverged_at=4) for s in (0, 1) for n in (1, 2)]
    self.assertIn('| rope | 0 of 2; 2 diverged at steps 4, 4 | — |',
                  results.summary_markdown(rows, 1, 2))

  def test_comparison_leaves_diverged_seed_out_and_notes_it(self):
    a = [_row(s, 2, 0.5) for s in (0, 1)]
    b = [_row(0, 2, 0.7), _row(1, 2, 0.0, diverged_at=9)]
    text = results.comparison_markdown(a, b, names=('old', 'new'), train_max=(2, 2))
    self.assertIn('| rope | 1–L | 50.0 ± 0.0, worst 50.0 (2) | 70.0 (1) | +20.0 | '
                  'new: 1 of 2; 1 diverged at step 9 seeds |', text)

  def test_diverged_at_round_trips_through_results_csv(self):
    path = os.path.join(tempfile.mkdtemp(), 'results.csv')
    result_files.write_rows(path, [_row(0, 1, 0.5), _row(1, 1, 0.0, diverged_at=12)])
    read = result_files.read_rows(path)
    self.assertEqual([r['diverged_at'] for r in read], [None, 12])

  def test_entry_point_message_names_each_diverged_run(self):
    self.assertIsNone(divergence.message([_row(0, 1, 0.5)]))
    text = divergence.message([_row(0, 1, 0.5), _row(1, 1, 0.0, diverged_at=12)])
    self.assertIn('copy/rope seed 1 at step 12', text)
    self.assertIn(f'Exit status {divergence.DIVERGED}', text)

  def test_unreadable_diverged_json_still_counts_as_diverged(self):
    run_dir = tempfile.mkdtemp()
    with open(os.path.join(run_dir, divergence.FILE), 'w') as f:
      f.write('{"st')
    self.assertEqual(divergence.diverged_at(run_dir), -1)
    self.assertIsNone(divergence.diverged_at(tempfile.mkdtemp()))


class SuiteScoresTest(absltest.TestCase):

  def _record(self, lr, scores, diverged_at):
    per_seed = [dict(score_official=s, score_plain=s, in_range=s) for s in scores]
    return dict(task='parity_check', level='regular', encoding='alibi', learning_rate=lr,
                seeds=list(range(len(scores))), per_seed=per_seed,
                scores=encoder.setting_scores(per_seed, diverged_at),
                train_accuracy=[0.5] * len(scores), diverged_at=diverged_at)

  def test_diverged_step_is_the_end_of_the_first_nonfinite_call(self):
    loss = np.array([[1.0, 1.0, 1.0], [np.nan, 1.0, 1.0], [np.nan, np.inf, 1.0]], np.float32)
    t = copy_config.get_config('scale=tiny').train  # only steps_per_call is read
    t.steps_per_call = 5
    self.assertEqual(suite_trainer.diverged_steps(loss, t), [10, 15, None])

  def test_diverged_seed_left_out_of_max_and_mean(self):
    scores = encoder.setting_scores(
        [dict(score_official=x, score_plain=x, in_range=x) for x in (0.6, 0.8, 0.9)],
        [None, None, 30])
    self.assertEqual(scores['seeds'], 2)
    self.assertAlmostEqual(scores['score_official']['max'], 0.8)
    self.assertAlmostEqual(scores['score_official']['mean'], 0.7)

  def test_a_learning_rate_whose_seeds_all_diverged_is_never_best(self):
    records = [self._record(1e-3, [0.6, 0.7], [None, None]),
               self._record(1.0, [0.9, 0.9], [20, 20])]
    combined = suite_report.combine(records)[('parity_check', 'alibi')]
    self.assertAlmostEqual(combined['score_official']['max'], 0.7)
    self.assertEqual(combined['score_official']['learning_rate'], 1e-3)
    self.assertEqual(combined['diverged'], [(1.0, 0, 20), (1.0, 1, 20)])
    self.assertIn('parity_check × alibi (lr 1): 2 of 2 seeds diverged',
                  suite_report.diverged_message(records))
    self.assertIsNone(suite_report.diverged_message(records[:1]))


class DivergedTrainingTest(absltest.TestCase):
  """One tiny training at an absurd learning rate, its files, and a rerun."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.workdir = os.path.join(tempfile.mkdtemp(), 'run')
    c = copy_config.get_config('scale=tiny,encoding=rope')
    c.train.learning_rate = 1e6
    c.train.tensorboard = False
    cls.config = c
    _, cls.last = loop.train(c, cls.workdir, progress=False)

  def test_diverged_run_stops_and_records_the_step(self):
    step = divergence.diverged_at(self.workdir)
    self.assertIsNotNone(step)
    self.assertEqual(self.last['diverged_at'], step)
    self.assertFalse(np.isfinite(self.last['loss']))
    with open(os.path.join(self.workdir, 'metrics.jsonl')) as f:
      lines = [json.loads(line) for line in f]
    self.assertEqual(lines[-1]['step'], step)  # nothing logged after it

  def test_rerun_does_not_train_it_again(self):
    path = os.path.join(self.workdir, 'metrics.jsonl')
    before = open(path).read()
    _, last = loop.train(self.config, self.workdir, progress=False)
    self.assertEqual(open(path).read(), before)
    self.assertEqual(last, {})  # no step trained
    self.assertIsNotNone(divergence.diverged_at(self.workdir))


if __name__ == '__main__':
  absltest.main()
