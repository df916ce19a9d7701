"""The addition grid (digits of a × digits of b) and the addition study:
what it writes, that a rerun reuses it and a new grid re-evaluates it."""

import json
import os
import tempfile

import chex
import numpy as np
import pytest
from absl.testing import absltest

from attention_jax.lab.config import facts
from attention_jax.lab.report import plots
from attention_jax.lab.evaluate import grid
from attention_jax.lab.runs.study import run_study
from attention_jax.lab.config.resolved import resolve
from tests.lab.configs import with_fields


def _config(**overrides):
  from configs import addition  # pylint: disable=import-outside-toplevel
  c = addition.get_config('scale=tiny')
  c.study.seeds = (0,)
  c.study.parallel_setups = 1
  return with_fields(c, **overrides)


class GridTest(chex.TestCase):

  def test_addition_grid_rows_per_cell_and_model(self):
    c = _config()
    task = facts.configured_task(c)
    trained = [resolve(c).build_model(seed) for seed in (0, 1)]
    rows = grid.evaluate_grid(trained, task, (1, 2, 6), train_max=3, num_samples=4,
                              vocab_size=10, batch_size=4)
    self.assertLen(rows, 2)
    for model_rows in rows:
      cells = [(r['digits_a'], r['digits_b']) for r in model_rows]
      self.assertCountEqual(cells, [(a, b) for a in (1, 2, 6) for b in (1, 2, 6)])
      for r in model_rows:
        self.assertBetween(r['exact_match'], 0.0, 1.0)
    # One model alone scores what it scored stacked with another (same data).
    alone = grid.evaluate_grid(trained[:1], task, (1, 2, 6), train_max=3, num_samples=4,
                               vocab_size=10, batch_size=4)[0]
    for r, s in zip(rows[0], alone):
      self.assertAlmostEqual(r['token_accuracy'], s['token_accuracy'], places=5)

  def test_addition_grid_table_figure_and_damage(self):
    rows = [dict(task='addition', encoding=e, seed=s, digits_a=a, digits_b=b,
                 exact_match=float(a + b <= 4), token_accuracy=1.0)
            for e in ('rope:coupled', 'none:abacus') for s in (0, 1)
            for a in (1, 2, 4) for b in (1, 2, 4)]
    text = grid.grid_markdown(rows, train_max=2)
    self.assertIn('#### addition, none:abacus', text)
    self.assertIn('| 1 | 100* | 100* | 0 |', text)
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, 'grid.csv')
    grid.write_grid(path, rows)
    self.assertEqual(grid.read_grid(path), rows)
    plots.plot_grid(rows, os.path.join(folder, 'grid.png'), train_max=2)
    self.assertGreater(os.path.getsize(os.path.join(folder, 'grid.png')), 1000)
    with open(path, 'w') as f:
      f.write('task,encoding\naddition,x\n')
    with self.assertRaisesRegex(ValueError, f'{path}: not a grid table'):
      grid.read_grid(path)


@pytest.mark.slow
class AdditionStudyTest(chex.TestCase):

  def test_addition_study_writes_grid_reuses_and_reevaluates(self):
    workdir = tempfile.mkdtemp()
    c = _config(study__encodings=('rope:coupled', 'fire:hints'))
    rows = run_study(c, workdir, log=lambda m: None)
    self.assertEqual({r['encoding'] for r in rows}, {'rope:coupled', 'fire:hints'})
    for name in ('results.csv', 'grid.csv', 'summary.md', 'addition_grid.png',
                 'extrapolation.png'):
      self.assertTrue(os.path.exists(os.path.join(workdir, name)), name)
    with open(os.path.join(workdir, 'ceiling.csv')) as f:
      self.assertLen(f.readlines(), 1)  # the header: no k-gram ceiling for a sum
    table = grid.read_grid(os.path.join(workdir, 'grid.csv'))
    self.assertLen(table, 2 * 4)  # two runs × (1, 6)²
    run_dir = os.path.join(workdir, 'addition', 'fire:hints', 'seed0')
    with open(os.path.join(run_dir, 'config.json')) as f:
      self.assertTrue(json.load(f)['task']['index_hints'])
    # The same command: nothing trained or evaluated again.
    log = []
    again = run_study(c, workdir, log=log.append)
    self.assertTrue(all('finished earlier, reused' in m for m in log if '[' in m), log)
    self.assertEqual(len(again), len(rows))
    # Another grid: evaluated again from the checkpoints, not retrained.
    c = _config(study__encodings=('rope:coupled', 'fire:hints'), eval__grid=(1, 3, 6))
    log = []
    run_study(c, workdir, log=log.append)
    self.assertFalse(any('training seeds' in m for m in log), log)
    self.assertLen(grid.read_grid(os.path.join(workdir, 'grid.csv')), 2 * 9)
    np.testing.assert_array_equal(
        sorted({r['digits_b'] for r in grid.read_grid(os.path.join(run_dir, 'grid.csv'))}),
        [1, 3, 6])


if __name__ == '__main__':
  absltest.main()
