"""A sweep split over processes: shards, run-directory locks, time boxes."""

import contextlib
import csv
import fcntl
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from unittest import mock

import chex
from absl.testing import absltest
import pytest
from absl.testing import parameterized

from attention_jax.lab.runs import cluster
from attention_jax.lab.runs import locks
from attention_jax.lab import train
from attention_jax.lab.runs.process import entry_point
from attention_jax.lab.runs.one_run import run_one
from attention_jax.lab.runs.study import run_study
from attention_jax.lab.runs.one_run import shared_optimizer
from attention_jax.lab.train import loop
from attention_jax.lab.train.interrupt import TIME_BUDGET
from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.config.validate import validate_config
from configs import copy as copy_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# Two setups, one length bucket each side of L_train, no generation: few compiles.
STUDY_FLAGS = ("--config.study.encodings=('none','alibi')", '--config.eval.generate=False',
               '--config.eval.lengths=(2,6)', '--config.study.parallel_setups=1')
# One XLA compilation cache for this file's processes: a program compiled by
# one is loaded by the next (the same executable, so the same numbers).
_CACHE = tempfile.mkdtemp()
_CACHE_ENV = dict(JAX_COMPILATION_CACHE_DIR=_CACHE, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
                  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')


def tearDownModule():
  shutil.rmtree(_CACHE, ignore_errors=True)


def _study():
  c = copy_config.get_config('scale=tiny')
  c.study.encodings, c.study.parallel_setups = ('none', 'alibi'), 1
  c.eval.update(generate=False, lengths=(2, 6))
  return c


def _run_config(**train_overrides):
  c = copy_config.get_config('scale=tiny,encoding=none')
  c.eval.update(generate=False, lengths=(2, 6))
  c.train.update(**train_overrides)
  return c


def _sorted_rows(path):
  with open(path, newline='') as f:
    return sorted(tuple(r.items()) for r in csv.DictReader(f))


def _steps(run_dir):
  with open(os.path.join(run_dir, 'metrics.jsonl')) as f:
    return [json.loads(line)['step'] for line in f]


@contextlib.contextmanager
def _held_by_another(directory, holder='host elsewhere pid 4242 since 2000-01-01T00:00:00'):
  """The lock of `directory` taken through a descriptor of its own, as
  another process's would be (flock conflicts between open files)."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, locks.LOCK_FILE), 'w') as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.write(holder + '\n')
    f.flush()
    yield holder


def _start(module, workdir, *flags, env=None):
  return subprocess.Popen(
      [sys.executable, '-m', module, '--config=configs/copy.py:scale=tiny',
       f'--workdir={workdir}', *flags], cwd=ROOT, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True, env=dict(os.environ, **_CACHE_ENV, **(env or {})))


class ShardTest(parameterized.TestCase):

  def test_shards_partition_the_sweep_and_keep_stacked_seeds_together(self):
    names = [f'copy/{e}/seed{s}' for e in ('rope', 'alibi', 'none') for s in (0, 1)]
    setups = [os.path.dirname(n) for n in names]
    for count in (1, 2, 4):
      parts = [cluster.shard_runs(names, i, count, setups=setups) for i in range(count)]
      self.assertCountEqual([i for p in parts for i in p], range(len(names)))
      for part in parts:  # both seeds of a setup on one shard
        self.assertEqual({setups[i] for i in part} & {setups[i] for p in parts
                                                      if p is not part for i in p}, set())
    # Sorted names dealt round-robin: alibi, none to shard 0 and 1 of 3 …
    self.assertEqual(cluster.shard_runs(names, 0, 3, setups=setups), [2, 3])
    # … whatever order the sweep lists them in.
    reordered = names[::-1]
    self.assertEqual({reordered[i] for i in cluster.shard_runs(reordered, 1, 2)},
                     {names[i] for i in cluster.shard_runs(names, 1, 2)})

  def test_shard_from_slurm_array_variables(self):
    c = _study()
    env = lambda task, count, low='0', step='1': dict(
        SLURM_ARRAY_TASK_ID=task, SLURM_ARRAY_TASK_COUNT=count, SLURM_ARRAY_TASK_MIN=low,
        SLURM_ARRAY_TASK_STEP=step)
    self.assertEqual(cluster.shard_of(c, {}), (0, 1))
    self.assertEqual(cluster.shard_of(c, env('3', '4')), (3, 4))
    self.assertEqual(cluster.shard_of(c, env('1', '4', low='1')), (0, 4))  # --array=1-4
    self.assertEqual(cluster.shard_of(c, env('8', '4', step='4')), (2, 4))  # --array=0-15:4
    with self.assertRaisesRegex(ConfigError, r'SLURM_ARRAY_TASK_ID=9, .* not an index in 0…3'):
      cluster.shard_of(c, env('9', '4', low='1'))
    c.study.shard = (1, 2)  # the config wins over the environment
    self.assertEqual(cluster.shard_of(c, env('3', '4')), (1, 2))

  @parameterized.parameters(((2, 2),), ((0, 0),), ((1,),), ((-1, 2),))
  def test_bad_shard_is_one_line_naming_the_value(self, shard):
    c = _study()
    c.study.shard = shard
    with self.assertRaises(ConfigError) as caught:
      validate_config(c, study=True)
    self.assertIn(f'study.shard={shard!r}', str(caught.exception))
    self.assertNotIn('\n', str(caught.exception))


class LockTest(absltest.TestCase):

  def test_a_held_run_is_refused_with_one_line_naming_the_holder(self):
    workdir = os.path.join(tempfile.mkdtemp(), 'one')
    with _held_by_another(workdir) as holder:
      with self.assertRaises(locks.RunLocked) as caught, locks.hold(workdir):
        pass
      self.assertEqual(caught.exception.holder, holder)
      # Through the entry point: one line on stderr, exit 2, nothing written.
      stderr = io.StringIO()
      c = _run_config()
      with self.assertRaises(SystemExit) as exited, contextlib.redirect_stderr(stderr):
        with entry_point(c):
          run_one(c, workdir)
    self.assertEqual(exited.exception.code, 2)
    self.assertRegex(stderr.getvalue(), f'^error: {workdir} is in use by {holder} .*\n$')
    self.assertEqual(os.listdir(workdir), [locks.LOCK_FILE])

  def test_a_dead_holders_lock_file_does_not_block(self):
    workdir = tempfile.mkdtemp()
    with open(os.path.join(workdir, locks.LOCK_FILE), 'w') as f:
      f.write('host gone pid 1 since 2000-01-01T00:00:00\n')  # no flock: its process died
    with locks.hold(workdir) as path:
      self.assertIn(f'pid {os.getpid()} ', open(path).read())

  def test_wait_takes_the_lock_when_the_holder_lets_go(self):
    workdir, messages = tempfile.mkdtemp(), []
    with mock.patch.object(locks, 'POLL_SECONDS', 0.02):
      with _held_by_another(workdir) as holder:
        done = threading.Event()

        def waiter():
          with locks.hold(workdir, wait=True, log=messages.append):
            done.set()
        thread = threading.Thread(target=waiter)
        thread.start()
        self.assertFalse(done.wait(0.3))  # still held
      thread.join(5)
    self.assertTrue(done.is_set())
    self.assertEqual(messages, [f'{workdir} is in use by {holder}; waiting for it'])

  def test_reentrant_in_a_thread_and_exclusive_between_threads(self):
    workdir, refused = tempfile.mkdtemp(), []

    def other():
      try:
        with locks.hold(workdir):
          pass
      except locks.RunLocked as e:
        refused.append(e.holder)

    with locks.hold(workdir), locks.hold(workdir):  # the study, then train inside it
      thread = threading.Thread(target=other)
      thread.start()
      thread.join()
    self.assertLen(refused, 1)
    self.assertStartsWith(refused[0], 'another thread of this process')
    other()  # released: taken and given back
    self.assertLen(refused, 1)


class TimeBudgetTest(absltest.TestCase):

  @pytest.mark.slow
  def test_max_minutes_checkpoints_exits_75_and_the_same_call_continues(self):
    c = _run_config(num_steps=6, checkpoint_every=0, max_minutes=1)
    tx = shared_optimizer(c.train)
    straight, boxed = tempfile.mkdtemp(), tempfile.mkdtemp()
    train.train(c, straight, progress=False, tx=tx, deadline=float('inf'))
    clock = iter(range(0, 10_000, 25))  # 25 s per reading: the budget's 60 s end at step 3
    with mock.patch.object(loop, '_now', lambda: next(clock)):
      with self.assertRaises(TrainingInterrupted) as caught:
        train.train(c, boxed, progress=False, tx=tx)
    self.assertEqual(caught.exception.exit_code, TIME_BUDGET)
    self.assertRegex(caught.exception.args[0], r'^stopped by train.max_minutes=1 .* after '
                     r'step 3 of 6; checkpoint saved in .*run the same command again')
    self.assertEqual(loop._latest_step(boxed), 3)
    train.train(c, boxed, progress=False, tx=tx)  # the same call, on a fresh budget
    self.assertEqual(_steps(boxed), list(range(6)))
    with open(os.path.join(straight, 'metrics.jsonl')) as a, open(
        os.path.join(boxed, 'metrics.jsonl')) as b:
      losses = [[json.loads(line)['loss'] for line in f] for f in (a, b)]
    chex.assert_trees_all_close(losses[0], losses[1], rtol=0, atol=0)

  def test_a_study_out_of_time_starts_no_run_and_writes_no_outputs(self):
    c = _study()
    c.train.max_minutes = 0.5
    workdir = tempfile.mkdtemp()
    clock = iter(range(0, 10_000, 60))  # past the budget at the first setup
    with mock.patch.object(loop, '_now', lambda: next(clock)):
      with self.assertRaises(TrainingInterrupted) as caught:
        run_study(c, workdir, log=lambda _: None)
    self.assertEqual(caught.exception.exit_code, TIME_BUDGET)
    self.assertIn('train.max_minutes=0.5 before copy none', caught.exception.args[0])
    self.assertFalse(os.path.exists(os.path.join(workdir, 'results.csv')))


@pytest.mark.slow
class ProcessTest(absltest.TestCase):
  """Several processes at once on one workdir."""

  def test_two_shards_write_the_results_of_one_process(self):
    shared, alone = tempfile.mkdtemp(), tempfile.mkdtemp()
    module = 'experiments.length_extrapolation'
    shards = [_start(module, shared, *STUDY_FLAGS, '--config.study.shard=(0,2)'),
              _start(module, shared, *STUDY_FLAGS,
                     env=dict(SLURM_ARRAY_TASK_ID='2', SLURM_ARRAY_TASK_MIN='1',
                              SLURM_ARRAY_TASK_COUNT='2'))]
    outputs = [p.communicate(timeout=240)[0] for p in shards]
    self.assertEqual([p.returncode for p in shards], [0, 0], outputs)
    for k, out in enumerate(outputs):
      self.assertIn(f'shard {k} of 2: 1 of the 2 runs', out)
    self.assertTrue(any('outputs not written yet: 1 of the 2 runs' in out for out in outputs)
                    or all('\n| ' in out for out in outputs), outputs)  # or both finished at once
    one = _start(module, alone, *STUDY_FLAGS)
    out = one.communicate(timeout=240)[0]
    self.assertEqual(one.returncode, 0, out)
    self.assertEqual(_sorted_rows(os.path.join(shared, 'results.csv')),
                     _sorted_rows(os.path.join(alone, 'results.csv')))
    # The report step alone: nothing trained, the same table.
    c = _study()
    c.study.report_only = True
    os.remove(os.path.join(shared, 'results.csv'))
    self.assertLen(run_study(c, shared, log=lambda _: None), 2 * 2)  # 2 runs × 2 lengths
    self.assertEqual(_sorted_rows(os.path.join(shared, 'results.csv')),
                     _sorted_rows(os.path.join(alone, 'results.csv')))
    empty = tempfile.mkdtemp()
    with self.assertRaisesRegex(ConfigError, r'^study.report_only: 2 of the 2 runs are not '
                                r'finished \(first: copy/none/seed0\)'):
      run_study(c, empty, log=lambda _: None)
    self.assertEqual(os.listdir(empty), [])  # refused before anything is written

  def test_two_processes_on_one_run_lose_nothing(self):
    workdir = os.path.join(tempfile.mkdtemp(), 'one')
    flags = ('--config.model.encoding=none', '--config.eval.generate=False',
             '--config.eval.lengths=(2,6)', '--config.study.on_locked=wait')
    procs = [_start('experiments.train', workdir, *flags) for _ in range(2)]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    self.assertEqual([p.returncode for p in procs], [0, 0], outputs)
    c = _run_config()
    self.assertEqual(_steps(workdir), list(range(c.train.num_steps)))  # each step once
    loop.load_trained(c, workdir)  # the final checkpoint restores
    with open(os.path.join(workdir, 'results.csv')) as f:
      self.assertEqual([r['length'] for r in csv.DictReader(f)], ['2', '6'])


if __name__ == '__main__':
  absltest.main()
