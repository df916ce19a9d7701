"""Training a run on past one invocation: a larger train.num_steps extends a
finished run, and a time box too short to train one interval says so.

One tiny study (one run of N steps) is trained once for the module and
extended to 2N steps once; each test works on its own copy.
"""

import contextlib
import csv
import io
import itertools
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from unittest import mock

import chex
from absl.testing import absltest
import pytest
from flax import nnx

from attention_jax.lab.config import identity
from attention_jax.lab import train
from attention_jax.lab.runs.plan import config_hash
from attention_jax.lab.runs.one_run import run_one
from attention_jax.lab.runs.study import run_study
from attention_jax.lab.runs.one_run import shared_optimizer
from attention_jax.lab.train import loop
from attention_jax.lab.train.interrupt import TIME_BUDGET
from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.train.optimizer import learning_rate_schedule
from attention_jax.lab.errors import ConfigError
from tests.lab.configs import with_fields
from configs import copy as copy_config

ROOT = pathlib.Path(__file__).resolve().parents[3]
N = 5  # the tiny preset's num_steps


def _config(**overrides):
  c = copy_config.get_config('scale=tiny,encoding=none')
  c.eval.update(generate=False, lengths=(2, 4))
  c.study.vmap_seeds = False
  return with_fields(c, **overrides)


def setUpModule():
  global _BASE, _EXTENDED, _LOG, _PRINTED  # pylint: disable=global-variable-undefined
  _BASE, _EXTENDED, _LOG = tempfile.mkdtemp(), tempfile.mkdtemp(), []
  run_study(_config(), _BASE, log=lambda _: None)
  shutil.copytree(_BASE, _EXTENDED, dirs_exist_ok=True)
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    run_study(_config(train__num_steps=2 * N), _EXTENDED, log=_LOG.append)
  _PRINTED = printed.getvalue()


def _copy(workdir) -> str:
  copy = tempfile.mkdtemp()
  shutil.copytree(workdir, copy, dirs_exist_ok=True)
  return copy


def _run0(workdir):
  return os.path.join(workdir, 'copy', 'none', 'seed0')


def _read(path):
  return pathlib.Path(path).read_text()


def _metric_lines(run_dir):
  return _read(os.path.join(run_dir, 'metrics.jsonl')).splitlines()


def _without_rate(lines):  # steps_per_second: wall clock, the one field allowed to differ
  return [{k: v for k, v in json.loads(line).items() if k != 'steps_per_second'}
          for line in lines]


def _params(run_dir, config):
  return nnx.to_pure_dict(nnx.state(loop.load_trained(config, run_dir), nnx.Param))


def _record(run_dir):
  return [{k: e[k] for k in ('from_step', 'previous_num_steps', 'num_steps')}
          for e in identity.extensions(run_dir)]


class ExtensionTest(absltest.TestCase):

  def test_the_study_trains_on_records_it_and_evaluates_again(self):
    run0, base0 = _run0(_EXTENDED), _run0(_BASE)
    self.assertIn(f'[1/1] copy none seed 0: trained to step {N} of {N}; extended to {2 * N} '
                  'steps', _LOG)
    self.assertIn(f'{run0}: trained to step {N} of {N}; continuing to {2 * N} (the schedule of '
                  f'train.num_steps={2 * N} from step {N}, not a run of {2 * N} steps from the '
                  f'start; recorded in {run0}/extensions.json)\n', _PRINTED)
    lines = _metric_lines(run0)
    self.assertEqual([json.loads(line)['step'] for line in lines], list(range(2 * N)))
    self.assertEqual(lines[:N], _metric_lines(base0))  # the first N steps' lines, kept as they were
    # The optimizer's step count indexes the new count's schedule from step N on.
    old, new = (learning_rate_schedule(_config(train__num_steps=n).train) for n in (N, 2 * N))
    self.assertEqual([json.loads(line)['learning_rate'] for line in lines],
                     [float(old(s)) for s in range(N)] + [float(new(s)) for s in range(N, 2 * N)])
    self.assertNotEqual(float(old(N)), float(new(N)))
    self.assertEqual(identity.checkpoint_steps(run0)[-1], 2 * N)
    self.assertEqual(_record(run0), [dict(from_step=N, previous_num_steps=N, num_steps=2 * N)])
    info = json.loads(_read(os.path.join(run0, 'run.json')))
    self.assertEqual(info['config']['train']['num_steps'], 2 * N)
    self.assertEqual(info['extensions'], identity.extensions(run0))
    self.assertNotIn('extensions', json.loads(_read(os.path.join(base0, 'run.json'))))
    # Evaluated again, under a hash of its own: neither the N-step model's
    # nor that of a run of 2N steps from the start.
    hashes = {r['config_hash'] for r in csv.DictReader(
        _read(os.path.join(run0, 'results.csv')).splitlines())}
    extended = config_hash(_config(train__num_steps=2 * N), identity.extensions(run0))
    self.assertEqual(hashes, {extended})
    self.assertNotIn(extended, {config_hash(_config()), config_hash(_config(train__num_steps=2 * N))})
    self.assertEqual(_read(os.path.join(_EXTENDED, 'results.csv')),
                     _read(os.path.join(run0, 'results.csv')))
    # The same command again: finished, nothing trained, nothing recorded twice.
    workdir, log = _copy(_EXTENDED), []
    run_study(_config(train__num_steps=2 * N), workdir, log=log.append)
    self.assertIn('[1/1] copy none seed 0: finished earlier, reused', log)
    self.assertEqual(_record(_run0(workdir)), _record(run0))

  def test_an_interrupted_extension_by_run_one_gives_the_studys_model(self):
    run0, longer = _run0(_copy(_BASE)), _config(train__num_steps=2 * N)
    tx = shared_optimizer(longer.train)  # the study's: no new compile
    with self.assertRaisesRegex(TrainingInterrupted, f'after step {N + 2} of {2 * N}'):
      train.train(_config(train__num_steps=2 * N, train__stop_after=N + 2), run0,
                  progress=False, tx=tx)
    self.assertEqual(_record(run0), [dict(from_step=N, previous_num_steps=N, num_steps=2 * N)])
    log = []
    run_one(longer, run0, tx=tx, log=log.append)
    self.assertEqual(_record(run0), _record(_run0(_EXTENDED)))  # resumed, not extended again
    self.assertIn(f'evaluating {run0} at 2 lengths', log)
    self.assertEqual(_without_rate(_metric_lines(run0)),
                     _without_rate(_metric_lines(_run0(_EXTENDED))))
    chex.assert_trees_all_equal(_params(run0, longer), _params(_run0(_EXTENDED), longer))
    self.assertEqual(_read(os.path.join(run0, 'results.csv')),
                     _read(os.path.join(_run0(_EXTENDED), 'results.csv')))

  def test_a_smaller_num_steps_or_another_change_is_still_refused(self):
    run0 = _run0(_copy(_EXTENDED))  # trained toward 2N
    before = _read(os.path.join(run0, 'config.json'))
    with self.assertRaisesRegex(identity.RunMismatch, re.escape(
        f'{run0} was trained toward train.num_steps={2 * N}, this config has {N + 1}: a run '
        f'cannot be shortened (its learning rate decays toward step {2 * N}); raise '
        'train.num_steps to train it longer; use a new --workdir, or '
        '--config.study.on_mismatch=retrain')):
      train.train(_config(train__num_steps=N + 1), run0, progress=False)
    # A longer count with another change is a mismatch naming both.
    with self.assertRaisesRegex(identity.RunMismatch, re.escape(
        f'trained with train.learning_rate=0.003, train.num_steps={2 * N}; this config has '
        f'train.learning_rate=0.001, train.num_steps={3 * N}; use a new')):
      run_one(_config(train__num_steps=3 * N, train__learning_rate=1e-3), run0)
    # The longer config is validated as any other, before anything is written.
    with self.assertRaisesRegex(ConfigError, rf'train.warmup_steps={4 * N} must be in '
                                rf'0…train.num_steps={3 * N}'):
      run_one(_config(train__num_steps=3 * N, train__warmup_steps=4 * N), run0)
    self.assertEqual(_read(os.path.join(run0, 'config.json')), before)
    self.assertLen(identity.extensions(run0), 1)
    # on_mismatch='retrain' is for a real mismatch only: a shorter run trains
    # beside it, a longer one extends it.
    self.assertEqual(identity.resolve(run0, _config(train__num_steps=N + 1,
                                                    study__on_mismatch='retrain')), run0 + '-2')
    self.assertEqual(identity.resolve(run0, _config(train__num_steps=3 * N,
                                                    study__on_mismatch='retrain')), run0)

  @pytest.mark.slow
  def test_experiments_train_extends_a_run(self):
    run0 = _run0(_copy(_BASE))
    out = subprocess.run(
        [sys.executable, '-m', 'experiments.train', '--config=configs/copy.py:scale=tiny,'
         'encoding=none', '--config.eval.generate=False', '--config.eval.lengths=(2,4)',
         f'--config.train.num_steps={2 * N}', f'--workdir={run0}'],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, JAX_PLATFORMS='cpu'))
    self.assertEqual(out.returncode, 0, out.stderr)
    self.assertIn(f'{run0}: trained to step {N} of {N}; continuing to {2 * N} (', out.stdout)
    self.assertEqual(_record(run0), _record(_run0(_EXTENDED)))
    self.assertEqual(_without_rate(_metric_lines(run0)),
                     _without_rate(_metric_lines(_run0(_EXTENDED))))
    self.assertEqual(json.loads(_read(os.path.join(run0, 'run.json')))['config']['train']
                     ['num_steps'], 2 * N)


class ShortTimeBoxTest(absltest.TestCase):

  def test_a_box_that_ends_before_one_interval_warns_and_the_rerun_resumes(self):
    c, workdir = _config(train__max_minutes=1), tempfile.mkdtemp()
    tx = shared_optimizer(c.train)  # the module's compiled step
    # The budget starts at 0; the first compiled call returns at 50 s, the
    # next at 55 s, the third past the 60 s: 3 steps, fewer than log_every=5.
    clock = itertools.chain([0, 50, 55], itertools.count(61))
    errors = io.StringIO()
    with mock.patch.object(loop, '_now', lambda: next(clock)), \
        contextlib.redirect_stderr(errors):
      with self.assertRaises(TrainingInterrupted) as caught:
        train.train(c, workdir, progress=False, tx=tx)
    self.assertEqual(caught.exception.exit_code, TIME_BUDGET)
    self.assertIn(f'after step 3 of {N}', caught.exception.args[0])
    self.assertEqual(errors.getvalue(), (
        'warning: train.max_minutes=1 ended this invocation after 3 steps (one interval is 5): '
        '50.0s went to starting and compiling (until the first compiled call returned), 11.0s '
        'to training; every rerun starts and compiles again, so each advances about as '
        'little. Set train.max_minutes above ~1.7 for an invocation to train more than it '
        'spends starting.\n'))
    train.train(c, workdir, progress=False, tx=tx)
    self.assertEqual([json.loads(line)['step'] for line in _metric_lines(workdir)],
                     list(range(N)))

  def test_when_a_box_is_long_enough(self):
    t = _config(train__max_minutes=2, train__log_every=2, train__checkpoint_every=4).train
    warn = lambda steps, startup, training: loop.short_box_warning(
        t, steps=steps, startup=startup, training=training, first_call=1)
    self.assertIsNone(warn(2, 5.0, 100.0))  # one interval (log_every=2), mostly training
    self.assertIsNone(warn(3, 60.0, 60.0))
    self.assertIn('after 1 steps (one interval is 2)', warn(1, 5.0, 0.0))
    # An interval trained, but starting took most of the box: twice it, 2 minutes.
    self.assertIn('70.0s went to starting and compiling (until the first compiled call '
                  'returned), 50.0s to training; every rerun starts and compiles again, so each '
                  'advances about as little. Set train.max_minutes above ~2.4 ',
                  warn(500, 70.0, 50.0))
    # The smaller of log_every and checkpoint_every is the interval.
    t.log_every = 8
    self.assertIn('(one interval is 4)', warn(3, 1.0, 100.0))


if __name__ == '__main__':
  absltest.main()
