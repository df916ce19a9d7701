"""The one runner (`runs.runner`), with a scratch benchmark defined here,
outside the package: a new benchmark gets shards, locks, report_only, the
time box, side-by-side jobs and the outputs' lock by implementing five
methods, and no runner code names it."""

import json
import os
import shutil
import tempfile
import threading
from unittest import mock

import ml_collections
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab.errors import ConfigError
from attention_jax.lab.runs import locks
from attention_jax.lab.runs import runner
from attention_jax.lab.train import loop
from attention_jax.lab.train.interrupt import TIME_BUDGET
from attention_jax.lab.train.interrupt import TrainingInterrupted

UNITS = ('a', 'b', 'c', 'd', 'e')


def _config(**study):
  return ml_collections.ConfigDict(dict(
      study=dict(dict(shard=(), report_only=False, parallel_setups=1, on_locked='refuse'),
                 **study),
      train=dict(max_minutes=0)))


class Squares:
  """A scratch benchmark: each unit's job writes UNIT.json (its square of
  a number) into its own folder; the outputs are the sum of all units."""

  def __init__(self, config, workdir, log):
    self.config, self.workdir, self.log = config, workdir, log
    self.trained = []  # units this process trained, in order
    self.finished_called = threading.Event()

  def _path(self, unit):
    return os.path.join(self.workdir, unit, 'result.json')

  def _done(self, unit):
    return os.path.exists(self._path(unit))

  def refuse_unfinished(self):
    missing = [u for u in UNITS if not self._done(u)]
    if missing:
      raise ConfigError(f'study.report_only: {len(missing)} units are not finished')

  def jobs(self, index, count):
    mine = [u for i, u in enumerate(UNITS) if i % count == index]
    for u in mine:
      if self._done(u):
        self.log(f'{u}: finished earlier, reused')
    return [runner.Job(directories=(os.path.join(self.workdir, u),), prefix=f'[{u}]',
                       what=f'unit {u}', work=u) for u in mine if not self._done(u)]

  def run_job(self, job, deadline):
    unit = job.work
    self.trained.append(unit)
    with open(self._path(unit), 'w') as f:
      json.dump(UNITS.index(unit) ** 2, f)

  def finish(self):
    self.finished_called.set()

  def write_outputs(self):
    if not all(self._done(u) for u in UNITS):
      self.log('outputs not written yet')
      return None
    total = 0
    for u in UNITS:
      with open(self._path(u)) as f:
        total += json.load(f)
    with open(os.path.join(self.workdir, 'outputs.json'), 'w') as f:
      json.dump(total, f)
    return total


class RunnerTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.workdir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.workdir, ignore_errors=True)
    self.lines = []

  def _run(self, **study):
    bench = Squares(_config(**study), self.workdir, self.lines.append)
    return bench, runner.run(bench)

  def test_one_process_trains_every_job_and_writes_the_outputs(self):
    bench, total = self._run()
    self.assertEqual(bench.trained, list(UNITS))
    self.assertEqual(total, sum(i * i for i in range(len(UNITS))))
    self.assertTrue(bench.finished_called.is_set())
    # Again: nothing trained, every unit reused, the same outputs.
    bench, again = self._run()
    self.assertEqual((bench.trained, again), ([], total))
    self.assertLen([l for l in self.lines if 'finished earlier, reused' in l], len(UNITS))

  @parameterized.parameters(2, 3)
  def test_shards_equal_one_process_and_the_last_writes_the_outputs(self, count):
    trained = []
    for index in range(count):
      bench, total = self._run(shard=(index, count))
      trained += bench.trained
      self.assertEqual(total is None, index < count - 1)
    self.assertCountEqual(trained, UNITS)  # each unit once, by exactly one shard
    with open(os.path.join(self.workdir, 'outputs.json')) as f:
      self.assertEqual(json.load(f), sum(i * i for i in range(len(UNITS))))

  def test_parallel_jobs_train_every_unit_once(self):
    bench, total = self._run(parallel_setups=3)
    self.assertCountEqual(bench.trained, UNITS)
    self.assertEqual(total, sum(i * i for i in range(len(UNITS))))

  def test_report_only_refuses_an_unfinished_benchmark_before_writing(self):
    with self.assertRaisesRegex(ConfigError, 'study.report_only: 5 units are not finished'):
      self._run(report_only=True)
    self.assertEqual(os.listdir(self.workdir), [])
    self._run()
    bench, total = self._run(report_only=True)
    self.assertEqual((bench.trained, total), ([], sum(i * i for i in range(len(UNITS)))))

  def test_a_job_another_process_holds_is_left_to_it(self):
    held = os.path.join(self.workdir, 'b')
    with mock.patch.object(locks, '_acquire',
                           lambda path: 'host:123' if path.startswith(held + os.sep) else None), \
        mock.patch.object(locks, '_release'):
      bench, total = self._run()
    self.assertEqual(bench.trained, ['a', 'c', 'd', 'e'])
    self.assertIsNone(total)
    self.assertIn('[b] unit b: in training by host:123; left to it', self.lines)

  def test_time_budget_stops_before_the_next_job(self):
    clock = iter([0.0] + [0.0] * 2 + [1e9] * 100)  # out of time from the third job on
    with mock.patch.object(loop, '_now', lambda: next(clock)):
      bench = Squares(_config(), self.workdir, self.lines.append)
      bench.config.train.max_minutes = 1
      with self.assertRaises(TrainingInterrupted) as caught:
        runner.run(bench)
    self.assertEqual(caught.exception.exit_code, TIME_BUDGET)
    self.assertIn('train.max_minutes=1 before unit c', caught.exception.args[0])
    self.assertEqual(bench.trained, ['a', 'b'])
    self.assertFalse(os.path.exists(os.path.join(self.workdir, 'outputs.json')))


if __name__ == '__main__':
  absltest.main()
