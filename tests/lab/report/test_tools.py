"""The follow-up tools on every kind of workdir: plot, comparison table,
attention maps, and experiments.train run again on a finished run.

One tiny study and one tiny experiments.train run are made once for the
whole file (`setUpModule`); every test reads them and writes elsewhere.
"""

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
import pytest

from attention_jax.lab.report import plots
from attention_jax.lab.report import results
from attention_jax.lab import trained
from attention_jax.lab.runs import workdirs
from attention_jax.lab.runs.diagnose import run_diagnostics
from attention_jax.lab.runs.diagnose import stored_config
from attention_jax.lab.runs.one_run import run_one
from attention_jax.lab.runs.study import run_study
from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.train.loop import run_name
from attention_jax.lab.errors import ConfigError
from configs import copy as copy_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_TMP = STUDY = RUN = None
_RESUMED = ''  # stdout of the run's resumption, progress bar off


def _tiny(encoding, **task):
  c = copy_config.get_config(f'scale=tiny,encoding={encoding}')
  c.eval.generate = False  # generation has its own tests; here it only costs time
  c.task.update(**task)
  return c


def _run_config():
  return _tiny('rope', train_max_length=3)  # another training range than the study's


def setUpModule():
  global _TMP, STUDY, RUN, _RESUMED
  _TMP = tempfile.mkdtemp()
  STUDY, RUN = os.path.join(_TMP, 'study'), os.path.join(_TMP, 'one')
  study = _tiny('alibi')
  study.study.encodings = ('alibi',)  # not the default config's: read from the workdir
  run_study(study, STUDY, log=lambda _: None)
  stopped = _run_config()
  stopped.train.stop_after = 2
  with contextlib.suppress(TrainingInterrupted):
    run_one(stopped, RUN)
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    run_one(_run_config(), RUN)
  _RESUMED = out.getvalue()


def tearDownModule():
  if _TMP:
    shutil.rmtree(_TMP, ignore_errors=True)


def _process(*args):
  return subprocess.run([sys.executable, '-m', *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=240)


def _mtimes(folder):
  return {n: os.path.getmtime(os.path.join(folder, n)) for n in os.listdir(folder)}


@pytest.mark.slow
class ReadWorkdirTest(absltest.TestCase):

  def test_both_kinds_are_read(self):
    study, run = workdirs.read(STUDY), workdirs.read(RUN)
    self.assertEqual((study.kind, run.kind), ('study', 'run'))
    self.assertEqual((study.train_range, run.train_range), ((1, 4), (1, 3)))
    self.assertEqual(list(run.curves), ['copy/rope/seed0'])
    self.assertEqual([r['step'] for r in run.curves['copy/rope/seed0']], list(range(5)))
    self.assertEqual(list(study.curves), ['copy/alibi/seed0'])
    self.assertEqual({r['encoding'] for r in run.rows}, {'rope'})

  def test_a_folder_of_neither_kind_is_named(self):
    empty = tempfile.mkdtemp()
    with self.assertRaisesRegex(ConfigError, f'--workdir={empty} holds neither; expected a '
                                'study workdir .* or a run workdir'):
      workdirs.read(empty)
    with self.assertRaisesRegex(ConfigError, 'no such folder'):
      workdirs.read(os.path.join(empty, 'missing'))

  def test_training_ranges_that_differ_are_shown_as_their_union(self):
    marks = plots.training_marks({'study': (1, 4), 'one': (1, 3)})
    self.assertEqual(marks['span'], (1, 4))
    self.assertEqual(marks['label'], 'training lengths, union of study 1–4, one 1–3')
    self.assertEqual(marks['lines'], [(3, 'L_train = 3 (one)'), (4, 'L_train = 4 (study)')])
    self.assertFalse(marks['shared'])
    same = plots.training_marks({'a': (1, 4), 'b': (1, 4), 'c': None})
    self.assertEqual((same['span'], same['shared']), ((1, 4), True))
    self.assertEqual([n for n, _ in same['lines']], [8, 16, 32])


@pytest.mark.slow
class LoadTest(absltest.TestCase):
  """`lab.trained.load` on both kinds of workdir."""

  def test_a_run_loads_and_predicts(self):
    for run_dir in (RUN, os.path.join(STUDY, 'copy', 'alibi', 'seed0')):
      run = trained.load(run_dir)
      self.assertEqual(run.task.name, 'copy')
      prediction = run.predict([1, 2, 3])
      self.assertIsInstance(prediction.tokens, list)
      if prediction.output is not None:
        self.assertTrue(all(0 <= s < 16 for s in prediction.output))

  def test_a_study_names_its_runs(self):
    with self.assertRaisesRegex(ConfigError, f'{STUDY} is a study of 1 run; load one of '
                                f'them, e.g. {STUDY}/copy/alibi/seed0'):
      trained.load(STUDY)


@pytest.mark.slow
class CompareTest(absltest.TestCase):

  def test_cells_differences_and_cells_in_one_study_only(self):
    base = workdirs.read(STUDY).rows
    changed = [dict(r, token_accuracy=r['token_accuracy'] + 0.25) for r in base]
    changed += [dict(r, encoding='none') for r in base]
    table = results.comparison_markdown(base, changed, names=('a', 'b'), train_max=(4, 4))
    lines = table.splitlines()
    self.assertIn('| encoding | lengths | a | b | b − a | note |', lines)
    token = lines[lines.index('### copy: token accuracy'):lines.index('### copy: exact match')]
    rows = [line.split(' | ') for line in token if line.startswith('| alibi')]
    self.assertEqual([r[1] for r in rows], ['1–L', '2×L'])  # 4×, 8× past eval.max_length
    self.assertTrue(all(r[4] == '+25.0' for r in rows), rows)
    only = [line for line in token if line.startswith('| none')]
    self.assertLen(only, 2)
    self.assertTrue(all(line.endswith('| — | only in b |') for line in only), only)


@pytest.mark.slow
class PlotProcessTest(absltest.TestCase):

  def test_a_run_and_a_study_in_either_order(self):
    for first, second in ((RUN, STUDY), (STUDY, RUN)):
      out_dir = os.path.join(tempfile.mkdtemp(), 'figures')
      out = _process('experiments.plot', f'--workdir={first}', f'--workdir={second}',
                     f'--out={out_dir}')
      self.assertEqual(out.returncode, 0, out.stderr[-2000:])
      for name in ('extrapolation.png', 'training_curves.png', 'comparison.md'):
        self.assertGreater(os.path.getsize(os.path.join(out_dir, name)), 100, name)
      names = {RUN: 'one', STUDY: 'study'}
      self.assertIn(f'## {names[second]} against {names[first]}', out.stdout)

  def test_an_unreadable_workdir_is_one_line_and_writes_nothing(self):
    out_dir = os.path.join(tempfile.mkdtemp(), 'figures')
    empty = tempfile.mkdtemp()
    out = _process('experiments.plot', f'--workdir={STUDY}', f'--workdir={empty}',
                   f'--out={out_dir}')
    self.assertEqual(out.returncode, 2, out.stderr[-2000:])
    self.assertEqual(out.stderr.strip().splitlines(),
                     [f'error: --workdir={empty} holds neither; expected {workdirs.EXPECTED}.'])
    self.assertFalse(os.path.exists(out_dir))


@pytest.mark.slow
class AttentionMapsTest(absltest.TestCase):

  def test_study_config_is_read_from_the_workdir(self):
    self.assertEqual(tuple(stored_config(STUDY).study.encodings), ('alibi',))
    out = _process('experiments.attention_maps', f'--workdir={STUDY}')
    self.assertEqual(out.returncode, 0, out.stderr[-2000:])
    for name in ('attention_maps_alibi.png', 'attention_entropy.png'):
      self.assertGreater(os.path.getsize(os.path.join(STUDY, name)), 1000, name)
    paths = [os.path.join(STUDY, name) for name in ('attention_maps_alibi.png',
                                                     'attention_entropy.png')]
    self.assertIn('Figures: ' + ', '.join(paths), out.stdout)  # each by its whole path

  def test_a_run_workdir(self):
    draw_in = os.path.join(tempfile.mkdtemp(), 'one')
    shutil.copytree(RUN, draw_in)
    curves = run_diagnostics(None, draw_in, num_examples=2, log=lambda _: None)
    self.assertEqual(list(curves), ['rope'])
    self.assertEqual(curves['rope'].shape, (2 * 8 + 2,))  # tokens read at min(4 × 3, 8) = 8
    self.assertTrue(os.path.exists(os.path.join(draw_in, 'attention_maps_rope.png')))


@pytest.mark.slow
class RerunTest(absltest.TestCase):

  def test_resuming_is_said_with_the_progress_bar_off(self):
    self.assertIn('copy/rope seed0: resuming from step 2 of 5', _RESUMED)

  def test_progress_label_is_the_runs_own_name(self):
    seeds = [_tiny('alibi'), _tiny('alibi')]
    seeds[1].train.seed = 1
    self.assertEqual(run_name(seeds), 'copy/alibi seeds 0,1')
    self.assertEqual(run_name([_tiny('rope:stick_breaking')]), 'copy/rope:stick_breaking seed0')

  def test_a_finished_run_is_read_back_not_evaluated_again(self):
    before = _mtimes(RUN)
    out = _process('experiments.train', '--config=configs/copy.py:scale=tiny,encoding=rope',
                   '--config.task.train_max_length=3', '--config.eval.generate=False',
                   f'--workdir={RUN}')
    self.assertEqual(out.returncode, 0, out.stderr[-2000:])
    self.assertIn(f'{RUN}: finished at step 5; evaluation from {RUN}/results.csv', out.stdout)
    self.assertNotIn('evaluating', out.stdout)
    after = _mtimes(RUN)
    self.assertEqual(after['results.csv'], before['results.csv'])
    self.assertEqual(after['run.json'], before['run.json'])


if __name__ == '__main__':
  absltest.main()
