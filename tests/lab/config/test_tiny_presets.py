"""`scale=tiny` is tiny for every entry of every study of every config, and
a table whose entries had different step budgets shows each entry's."""

import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab.config import entries
from attention_jax.lab import evaluate
from attention_jax.lab.config import identity
from attention_jax.lab.runs import plan
from attention_jax.lab.report import result_files
from attention_jax.lab.report import results
from configs import addition as addition_config
from configs import copy as copy_config
from configs import flipflop as flipflop_config


def _row(encoding, steps, seed=0):
  return dict(task='copy', encoding=encoding, seed=seed, length=2, token_accuracy=0.5,
              exact_match=0.5, config_hash='h', version='v', num_steps=steps)


class TinyPresetTest(parameterized.TestCase):

  @parameterized.parameters(
      [(copy_config, s) for s in copy_config.STUDIES] +
      [(addition_config, s) for s in addition_config.STUDIES] +
      [(flipflop_config, s) for s in flipflop_config.STUDIES])
  def test_every_entry_trains_the_tiny_budget(self, module, study):
    c = module.get_config(f'scale=tiny,study={study}')
    steps = {(r.model.get('variant') or r.model.encoding): r.train.num_steps
             for r in plan.run_configs(c)}
    self.assertEqual(set(steps.values()), {c.train.num_steps}, steps)
    self.assertLessEqual(c.train.num_steps, 10)

  def test_tiny_variants_keep_every_field_but_the_step_count(self):
    out = entries.tiny_variants({'v': dict(model=dict(num_layers=1),
                                           train=dict(num_steps=3000, learning_rate=0.1)),
                                 'w': dict(train=dict(num_steps=3000))})
    self.assertEqual(out, {'v': dict(model=dict(num_layers=1), train=dict(learning_rate=0.1)),
                           'w': {}})


class OneBucketTest(absltest.TestCase):

  def test_tiny_evaluates_every_length_in_one_program(self):
    for module in (copy_config, addition_config):
      c = module.get_config('scale=tiny')
      lengths = evaluate.eval_lengths(c)
      self.assertGreater(max(lengths), c.task.train_max_length)  # past training, still one
      self.assertEqual(list(evaluate.buckets(lengths, evaluate.bucket_floor(c, lengths))),
                       [max(lengths)])
      grid = c.eval.get('grid', ())
      if grid:
        self.assertEqual(len(evaluate.buckets(grid, evaluate.bucket_floor(c, grid))), 1)

  def test_other_presets_keep_their_buckets_and_their_evaluation_record(self):
    c = copy_config.get_config()
    lengths = evaluate.eval_lengths(c)
    self.assertEqual(evaluate.bucket_floor(c, lengths), c.task.train_max_length)
    self.assertGreater(len(evaluate.buckets(lengths, evaluate.bucket_floor(c, lengths))), 1)
    # Runs recorded before the field existed are not evaluated again.
    self.assertNotIn('eval.one_bucket', identity.evaluation_fields(c))
    c.eval.one_bucket = True
    self.assertIn('eval.one_bucket', identity.evaluation_fields(c))


class StepsColumnTest(absltest.TestCase):

  def test_summary_shows_steps_when_budgets_differ(self):
    text = results.summary_markdown([_row('rope', 5), _row('mta_lookup', 3000)], 1, 2)
    self.assertIn('| encoding | seeds | steps | 1–L (2) |', text)
    self.assertIn('| mta_lookup | 1 | 3,000 |', text)
    self.assertIn('| rope | 1 | 5 |', text)

  def test_summary_has_no_steps_column_when_budgets_agree(self):
    text = results.summary_markdown([_row('rope', 5), _row('alibi', 5)], 1, 2)
    self.assertNotIn('steps', text)

  def test_comparison_names_different_budgets(self):
    text = results.comparison_markdown([_row('rope', 5)], [_row('rope', 50)],
                                       names=('a', 'b'), train_max=(2, 2))
    self.assertIn('a: 5 steps; b: 50 steps', text)

  def test_num_steps_round_trips_and_older_files_read_as_unknown(self):
    path = os.path.join(tempfile.mkdtemp(), 'results.csv')
    result_files.write_rows(path, [_row('rope', 5)])
    self.assertEqual(result_files.read_rows(path)[0]['num_steps'], 5)
    with open(path) as f:
      lines = f.read().splitlines()
    at = lines[0].split(',').index('num_steps')
    with open(path, 'w') as f:  # an older file: no num_steps column
      f.write('\n'.join(','.join(v for i, v in enumerate(line.split(',')) if i != at)
                        for line in lines) + '\n')
    self.assertIsNone(result_files.read_rows(path)[0]['num_steps'])


if __name__ == '__main__':
  absltest.main()
