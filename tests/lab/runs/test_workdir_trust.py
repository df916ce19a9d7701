"""What a workdir can be trusted with: it never mixes configs,
damaged files never block a resume, no stop request is lost, a bad config is
one line before anything is written (the declared dependencies: test_layout.py).

One tiny study (two seeds of NoPE, a few steps) is trained once for the whole
module; each test works on its own copy of it.
"""

import csv
import filecmp
import glob
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from unittest import mock

import numpy as np
from absl.testing import absltest
import pytest
from absl.testing import parameterized

from attention_jax.lab.config import identity
from attention_jax.lab import train
from attention_jax.lab.runs.diagnose import run_diagnostics
from attention_jax.lab.runs.one_run import run_one
from attention_jax.lab.runs.study import run_study
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.config.validate import validate_config
from tests.lab.configs import with_fields
from configs import addition as addition_config
from configs import copy as copy_config

ROOT = pathlib.Path(__file__).resolve().parents[3]
# The study's settings, as flags for the entry points and as a config here.
FLAGS = ('--config=configs/copy.py:scale=tiny,encoding=none', '--config.eval.generate=False',
         '--config.eval.lengths=(2,4)', '--config.study.seeds=(0,1)',
         '--config.train.checkpoint_every=2', '--config.train.checkpoint_keep=3')


def _config(**overrides):
  c = copy_config.get_config('scale=tiny,encoding=none')
  c.eval.update(generate=False, lengths=(2, 4))
  c.study.seeds = (0, 1)
  # Trained one at a time: compared bit for bit with run_one's resumes (a
  # vmapped group equals them to float tolerance only: tests/lab/train/test_seeds.py).
  c.study.vmap_seeds = False
  c.train.update(checkpoint_every=2, checkpoint_keep=3)  # checkpoints 2, 4 and 5
  return with_fields(c, **overrides)


def setUpModule():
  global _BASE  # the workdir of the module's one training
  _BASE = tempfile.mkdtemp()
  run_study(_config(), _BASE, log=lambda _: None)


def _copy() -> str:
  workdir = tempfile.mkdtemp()
  shutil.copytree(_BASE, workdir, dirs_exist_ok=True)
  return workdir


def _run0(workdir):
  return os.path.join(workdir, 'copy', 'none', 'seed0')


def _read(path):
  return pathlib.Path(path).read_text()


def _table(path):
  return list(csv.DictReader(_read(path).splitlines()))


def _metric_lines(run_dir):  # but steps_per_second, wall clock, the one field allowed to differ
  return [{k: v for k, v in json.loads(line).items() if k != 'steps_per_second'}
          for line in _read(os.path.join(run_dir, 'metrics.jsonl')).splitlines()]


def _checkpoints(run_dir):
  return sorted(int(n) for n in os.listdir(os.path.join(run_dir, 'checkpoints')) if n.isdigit())


ENV = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONUNBUFFERED='1')  # lines as printed


def _process(args):
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=300, env=ENV)


class WorkdirIdentityTest(absltest.TestCase):
  """A. A workdir never mixes configs."""

  def test_every_mismatch_is_refused_before_anything_trains(self):
    workdir = _copy()
    before = _read(os.path.join(workdir, 'results.csv'))
    with self.assertRaises(identity.RunMismatch) as raised:
      run_study(_config(train__num_steps=4, study__seeds=(0, 1, 2)), workdir, log=lambda _: None)
    message = str(raised.exception)
    # A larger count would extend the runs (tests/lab/train/test_train_longer.py); a smaller one cannot.
    self.assertIn(f'{_run0(workdir)} was trained toward train.num_steps=5, this config has 4: '
                  'a run cannot be shortened', message)
    self.assertIn('(1 more runs differ as well)', message)
    self.assertIn('--config.study.on_mismatch=retrain', message)
    self.assertNotIn('\n', message)
    self.assertFalse(os.path.exists(os.path.join(workdir, 'copy/none/seed2')))
    self.assertEqual(_read(os.path.join(workdir, 'results.csv')), before)

  def test_another_study_in_the_workdir_is_refused_naming_what_differs(self):
    workdir = _copy()
    files = lambda: {p: pathlib.Path(p).read_bytes()
                     for p in glob.glob(os.path.join(workdir, '*.*'))}
    before = files()
    addition = addition_config.get_config('scale=tiny,encoding=none')
    with self.assertRaisesRegex(ConfigError, re.escape(
        f"--workdir={workdir} holds a study of task 'copy' (copy/none/seed0); this config "
        "studies study.tasks=('addition',); a workdir holds one study")):
      run_study(addition, workdir, log=lambda _: None)
    # The same task, another recipe, another entry (no run directory in common).
    with self.assertRaisesRegex(ConfigError, re.escape(
        'holds another study: copy/none/seed0 was trained with train.learning_rate=0.003 '
        '(this config: 0.001)')):
      run_study(_config(train__learning_rate=1e-3, study__encodings=('rope',)), workdir,
                log=lambda _: None)
    self.assertFalse(os.path.exists(os.path.join(workdir, 'addition')))
    self.assertFalse(os.path.exists(os.path.join(workdir, 'copy', 'rope')))
    self.assertEqual(files(), before)

  def test_unfinished_run_refuses_a_changed_hyperparameter_or_shape(self):
    run_dir = _run0(_copy())
    shutil.rmtree(os.path.join(run_dir, 'checkpoints', '5'))  # stopped at step 4
    os.remove(os.path.join(run_dir, 'results.csv'))
    with self.assertRaisesRegex(identity.RunMismatch, re.escape(
        f'{run_dir} was trained with train.learning_rate=0.003, this config has 0.001; use a '
        'new --workdir, or --config.study.on_mismatch=retrain')):
      train.train(_config(train__learning_rate=1e-3), run_dir, progress=False)
    with self.assertRaisesRegex(identity.RunMismatch, 'model.d_model=16.*model.d_model=32'):
      run_one(_config(model__d_model=32), run_dir)
    self.assertEqual(_checkpoints(run_dir), [2, 4])

  def test_retrain_uses_a_fresh_sibling_and_outputs_cover_matching_runs_only(self):
    workdir = _copy()
    seed0 = _run0(workdir)
    old_metrics = _read(os.path.join(seed0, 'metrics.jsonl'))
    new = _config(train__learning_rate=1e-3, study__on_mismatch='retrain', study__seeds=(0,))
    run_study(new, workdir, log=lambda _: None)
    self.assertEqual(_read(os.path.join(seed0, 'metrics.jsonl')), old_metrics)
    table = _table(os.path.join(workdir, 'results.csv'))
    self.assertEqual(table, _table(seed0 + '-2/results.csv'))  # seed 1 was trained otherwise
    self.assertLen({r['config_hash'] for r in table}, 1)
    summary = _read(os.path.join(workdir, 'summary.md'))
    self.assertIn('cover 1 run,', summary)
    self.assertIn('copy/none/seed0 (trained with other train.learning_rate)', summary)
    # Back to the first config: its runs again, the retrained one left out.
    messages = []
    run_study(_config(study__seeds=(0,)), workdir, log=messages.append)
    self.assertEqual(messages, ['[1/1] copy none seed 0: finished earlier, reused'])
    table = _table(os.path.join(workdir, 'results.csv'))
    self.assertEqual({r['seed'] for r in table}, {'0', '1'})  # seed 1: an earlier sweep's
    self.assertEqual(table, _table(os.path.join(_BASE, 'results.csv')))
    summary = _read(os.path.join(workdir, 'summary.md'))
    self.assertIn('copy/none/seed1', summary)
    self.assertIn('copy/none/seed0-2 (trained with other train.learning_rate)', summary)

  def test_evaluation_change_evaluates_the_stored_models_again(self):
    workdir = _copy()
    seed0 = _run0(workdir)
    metrics, checkpoints = _read(os.path.join(seed0, 'metrics.jsonl')), _checkpoints(seed0)
    with mock.patch('os.replace', wraps=os.replace) as replace:
      rows = run_study(_config(eval__lengths=(2, 4, 6)), workdir, log=lambda _: None)
    self.assertEqual(sorted({r['length'] for r in rows}), [2, 4, 6])
    self.assertEqual(sorted({r['seed'] for r in rows}), [0, 1])
    self.assertEqual(_read(os.path.join(seed0, 'metrics.jsonl')), metrics)  # not retrained
    self.assertEqual(_checkpoints(seed0), checkpoints)
    run = json.loads(_read(os.path.join(seed0, 'run.json')))
    self.assertEqual(run['evaluation']['eval.lengths'], [2, 4, 6])
    # B: every result file is replaced whole (a temporary file renamed over it).
    replaced = {os.path.basename(call.args[1]) for call in replace.call_args_list}
    self.assertContainsSubset({'results.csv', 'run.json', 'summary.md', 'config.json'}, replaced)

  def test_what_derives_from_eval_settings_counts_as_trained(self):
    def diff(spec, **overrides):
      c = _config(model__encoding=spec)
      return [k for k, _, _ in identity.differences(c, _config(model__encoding=spec, **overrides))]
    self.assertEqual(diff('rope', eval__max_length=16, eval__num_samples=8), [])
    learned = diff('learned', eval__max_length=16)  # its table is sized from eval.max_length
    self.assertTrue(learned and all(k.startswith('shape of ') and k.endswith('table')
                                    for k in learned), learned)
    self.assertEqual(diff('rope:randomized', eval__max_length=16), ['eval.max_length'])
    self.assertEqual(diff('rope', train__log_every=1, study__seeds=(4,)), [])
    self.assertEqual(diff('rope', model__encoding_options={'t5': {'num_buckets': 8}}), [])
    self.assertEqual(diff('rope', train__seed=1), ['train.seed'])

  @pytest.mark.slow
  def test_attention_maps_read_finished_runs_and_never_train(self):
    workdir = _copy()
    seed0 = _run0(workdir)
    metrics, checkpoints = _read(os.path.join(seed0, 'metrics.jsonl')), _checkpoints(seed0)
    # Drawing (eager, slow) is tests/lab/evaluate/test_diagnostics.py's; here: which model is drawn.
    with mock.patch('attention_jax.lab.runs.diagnose._draw', return_value=np.zeros(12)) as draw:
      run_diagnostics(_config(), workdir, num_examples=2, log=lambda _: None)
    self.assertEqual(draw.call_args.args[0].config.train.seed, 0)
    self.assertEqual(_read(os.path.join(seed0, 'metrics.jsonl')), metrics)
    self.assertEqual(_checkpoints(seed0), checkpoints)
    with self.assertRaisesRegex(ConfigError, 'seed7 holds no trained run'):
      run_diagnostics(_config(study__seeds=(7,)), workdir, log=lambda _: None)
    self.assertFalse(os.path.exists(os.path.join(workdir, 'copy/none/seed7')))
    with self.assertRaisesRegex(identity.RunMismatch, 'train.learning_rate=0.003'):
      run_diagnostics(_config(train__learning_rate=1e-3), workdir, log=lambda _: None)
    shutil.rmtree(os.path.join(seed0, 'checkpoints', '5'))
    with self.assertRaisesRegex(ConfigError, 'is not finished: .* step 4 of 5'):
      run_diagnostics(_config(), workdir, log=lambda _: None)


class DamagedFilesTest(absltest.TestCase):
  """B. Damaged files never block a resume, and cost nothing else."""

  def _resume(self, run_dir, expect_warning=None):
    """Resumes the damaged run; it must end as the undamaged one did."""
    with mock.patch('absl.logging.warning') as warning:
      run_one(_config(), run_dir)
    messages = [call.args[0] % call.args[1:] for call in warning.call_args_list]
    self.assertLen(messages, 1 if expect_warning else 0)
    if expect_warning:
      self.assertIn(expect_warning, messages[0])
    original = _run0(_BASE)
    self.assertEqual(_metric_lines(run_dir), _metric_lines(original))
    self.assertEqual(_table(f'{run_dir}/results.csv'), _table(f'{original}/results.csv'))
    self.assertEqual(_checkpoints(run_dir), [2, 4, 5])

  def test_partial_last_metrics_line_is_dropped(self):
    run_dir = _run0(_copy())
    shutil.rmtree(os.path.join(run_dir, 'checkpoints', '5'))
    path = os.path.join(run_dir, 'metrics.jsonl')
    lines = _read(path).splitlines(keepends=True)  # killed while writing step 4's line:
    pathlib.Path(path).write_text(''.join(lines[:4]) + lines[4][:20])
    self._resume(run_dir)

  def test_truncated_newest_checkpoint_falls_back_to_the_one_before(self):
    run_dir = _run0(_copy())
    meta = os.path.join(run_dir, 'checkpoints', '5', 'default', '_METADATA')
    os.truncate(meta, os.path.getsize(meta) // 2)
    self._resume(run_dir, expect_warning=f'{run_dir}/checkpoints/5 (')
    self.assertTrue(os.path.exists(os.path.join(run_dir, 'checkpoints.damaged', '5')))

  def test_truncated_data_everywhere_starts_over(self):
    run_dir = _run0(_copy())
    for step in (2, 4, 5):
      for path in glob.glob(f'{run_dir}/checkpoints/{step}/default/**/d/*', recursive=True):
        os.truncate(path, os.path.getsize(path) // 2)
    self._resume(run_dir, expect_warning='training starts over from step 0')


class StopRequestTest(absltest.TestCase):
  """C. A stop request is honoured wherever it arrives, and resumed."""

  @pytest.mark.slow
  def test_sigterm_after_training_and_during_evaluation(self):
    workdir = _copy()
    seed0 = _run0(workdir)
    os.remove(os.path.join(seed0, 'results.csv'))  # trained, evaluation not written
    metrics = _read(os.path.join(seed0, 'metrics.jsonl'))
    # The signal right after the last training step (before evaluation).
    script = textwrap.dedent(f'''
        import os, signal
        from attention_jax.lab.runs.process import entry_point
        from attention_jax.lab.runs.study import run_study
        from tests.lab.runs.test_workdir_trust import _config
        kill = lambda *_: os.kill(os.getpid(), signal.SIGTERM)
        with entry_point(_config()):
          run_study(_config(), {workdir!r}, on_trained=kill)
        ''')
    out = _process(['-c', script])
    self.assertEqual(out.returncode, 128 + signal.SIGTERM, out.stderr[-3000:])
    self.assertIn(f'stopped by signal 15 after training {seed0}', out.stderr)
    self.assertIn('run the same command again to resume', out.stderr)
    self.assertNotIn('Traceback', out.stderr)
    # The signal during evaluation: many lengths, sent once evaluation began.
    proc = subprocess.Popen(
        [sys.executable, '-m', 'experiments.length_extrapolation', *FLAGS,
         '--config.eval.lengths=()', '--config.eval.max_length=64', f'--workdir={workdir}'],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    for line in proc.stdout:
      if f'evaluating {seed0}' in line:
        proc.send_signal(signal.SIGTERM)
        break
    else:
      self.fail(f'evaluation never started: {proc.communicate()[1][-3000:]}')
    _, stderr = proc.communicate(timeout=300)
    self.assertEqual(proc.returncode, 128 + signal.SIGTERM, stderr[-3000:])
    self.assertIn(f'stopped by signal 15 during the evaluation of {seed0}', stderr)
    self.assertNotIn('Traceback', stderr)
    self.assertFalse(os.path.exists(os.path.join(seed0, 'results.csv')))
    # The same command again: evaluated from the final checkpoint, not retrained.
    run_study(_config(), workdir, log=lambda _: None)
    self.assertEqual(_read(os.path.join(seed0, 'metrics.jsonl')), metrics)
    self.assertTrue(filecmp.cmp(os.path.join(seed0, 'results.csv'),
                                os.path.join(_run0(_BASE), 'results.csv'), shallow=False))


class ConfigErrorTest(parameterized.TestCase):
  """D. Every bad config is one line, before anything is written."""

  @parameterized.parameters(
      (dict(model__attention_implementation='flash'), "model.attention_implementation='flash': "
       r"choose one of \('cudnn', 'splash', 'pallas_tpu', 'pallas_gpu', 'chunked', "
       r"'path_blockwise', 'tpu_flash', 'dense', 'auto'\)"),
      (dict(model__encoding='t5', model__attention_implementation='chunked'),
       "model.attention_implementation='chunked' with 't5': .*not linear"),
      (dict(model__encoding='kerple', model__attention_implementation='chunked'), "with 'kerple'"),
      (dict(model__encoding='hard_alibi', model__attention_implementation='chunked'),
       "'chunked' with 'hard_alibi': .*a window bias"),
      (dict(model__encoding='windowed_rope:coupled', model__attention_implementation='splash'),
       "'splash' with 'windowed_rope:coupled': .*a window bias.*a TPU"),
      # Bad option values, on the default kernel too: refused before a file is written.
      (dict(model__encoding='hard_alibi', model__encoding_options={'hard_alibi': {'widths': (0,)}}),
       r'model.encoding_options.hard_alibi.widths=\(0,\) must be integers >= 1'),
      (dict(model__encoding='xpos', model__encoding_options={'xpos': {'scale_base': -1.0}}),
       'model.encoding_options.xpos.scale_base=-1.0 must be'),
      # Every option's type and range, checked where the encoding is built.
      (dict(model__encoding='rope', model__encoding_options={'rope': {'base': -1.0}}),
       r'model.encoding_options.rope.base=-1.0 must be a finite number > 1 \(θ_i'),
      (dict(model__encoding='rope', model__encoding_options={'rope': {'base': 0.0}}),
       r'model.encoding_options.rope.base=0.0 must be a finite number > 1'),
      (dict(model__encoding='rope', model__encoding_options={'rope': {'base': 'abc'}}),
       r"model.encoding_options.rope.base='abc' must be a finite number > 1"),
      (dict(model__encoding='sinusoidal',
            model__encoding_options={'sinusoidal': {'base': float('nan')}}),
       r'model.encoding_options.sinusoidal.base=nan must be a finite number > 1'),
      (dict(model__encoding='t5', model__encoding_options={'t5': {'num_buckets': 1}}),
       r'model.encoding_options.t5.num_buckets=1 must be an integer >= 2'),
      (dict(model__encoding='windowed_rope',
            model__encoding_options={'windowed_rope': {'sink': 'yes'}}),
       r"model.encoding_options.windowed_rope.sink='yes' must be True or False"),
      (dict(model__encoding='learned', model__encoding_options={'learned': {'stddev': -0.1}}),
       r'model.encoding_options.learned.stddev=-0.1 must be a finite number >= 0'),
      # A limit of the encoding's own, before training rather than after it.
      (dict(model__encoding='xpos', eval__max_length=20000, eval__lengths=(4, 20000)),
       r"eval.max_length=20000 on 'copy' reads positions 0 … 40001, past what 'xpos' serves: "
       r'xpos: .*scales stay representable only for positions -17847 … 17847'),
      # An encoding no run uses: its bad value is refused too, not left for a later run.
      (dict(model__encoding='rope', model__encoding_options={'t5': {'num_buckets': 1}}),
       r'model.encoding_options.t5.num_buckets=1 must be an integer >= 2'),
      (dict(eval__lengths=(4, 8, 4)),
       r'eval.lengths=\(4, 8, 4\) repeats 4; give each length once'),
      (dict(model__encoding='alibi:randomized', model__attention_implementation='chunked'),
       "'chunked' with 'alibi:randomized'"),
      (dict(train__learning_rate=-1e-3), 'train.learning_rate=-0.001 must be > 0'),
      (dict(train__learning_rate=0.0), 'train.learning_rate=0.0 must be > 0'),
      (dict(train__weight_decay=-0.1), 'train.weight_decay=-0.1 must be >= 0'),
      (dict(train__warmup_steps=6), 'train.warmup_steps=6 must be in 0…train.num_steps=5'),
      (dict(train__warmup_steps=-1), 'train.warmup_steps=-1'),
      (dict(train__grad_clip_norm=0.0), 'train.grad_clip_norm=0.0 must be > 0'),
      (dict(train__final_lr_fraction=1.5), r'train.final_lr_fraction=1.5 must be in \[0, 1\]'),
      (dict(model__encoding_options={'t6': {'x': 1}}), "model.encoding_options has 't6'"),
      (dict(model__encoding_options={'t5': {'buckets': 8}}),
       r"encoding_options.t5.buckets: 't5' takes \['max_distance', 'num_buckets'\]"),
      (dict(study__on_mismatch='overwrite'), "study.on_mismatch has 'overwrite'"),
  )
  def test_bad_value_is_one_config_error(self, overrides, message):
    with self.assertRaisesRegex(ConfigError, message):
      validate_config(_config(**overrides))

  def test_study_seeds_are_distinct_and_not_negative(self):
    for seeds, message in (((-1,), r'study.seeds=\(-1,\) must be integers >= 0.*bare 3'),
                           ((0, 0), r'study.seeds=\(0, 0\) repeats 0; give each seed once'),
                           ((1, 2, 1, 2), r'repeats 1, 2; give each seed once')):
      with self.assertRaisesRegex(ConfigError, message):
        validate_config(_config(study__seeds=seeds), study=True)
    validate_config(_config(study__seeds=(3,)), study=True)

  def test_chunked_serves_encodings_without_a_dense_bias(self):
    for spec in ('none', 'rope', 'alibi', 'learned', 'rope:randomized'):
      validate_config(_config(model__encoding=spec, model__attention_implementation='chunked'))

  def test_entry_points_print_one_line_and_create_nothing(self):
    for module, flag, message in (
        ('experiments.train', '--config.model.attention_implementation=flash',
         "error: invalid config: model.attention_implementation='flash': choose one of"),
        ('experiments.length_extrapolation', '--config.model.attention_implementation=chunked',
         "error: invalid config: model.attention_implementation='chunked' with 't5'")):
      workdir = os.path.join(tempfile.mkdtemp(), 'new')
      out = _process(['-m', module, '--config=configs/copy.py:scale=tiny,encoding=t5', flag,
                      f'--workdir={workdir}'])
      self.assertEqual(out.returncode, 2, out.stderr[-3000:])
      lines = out.stderr.strip().splitlines()
      self.assertLen(lines, 1, out.stderr)  # no traceback, no log: the message alone
      self.assertStartsWith(lines[0], message)
      self.assertFalse(os.path.exists(workdir))

  def test_error_raised_in_compiled_code_is_printed_first(self):
    script = textwrap.dedent('''
        import jax, jax.numpy as jnp
        from attention_jax.lab.runs.process import entry_point
        from attention_jax.positional import learned_lookup
        from configs import copy
        with entry_point(copy.get_config('scale=tiny')):
          table = jnp.zeros((4, 2))
          jax.block_until_ready(jax.jit(lambda p: learned_lookup(table, p))(jnp.arange(8)))
        ''')
    out = _process(['-c', script])
    self.assertEqual(out.returncode, 1, out.stderr[-3000:])
    lines = out.stderr.strip().splitlines()  # not XLA's "INTERNAL: CpuCallback error …"
    self.assertLen(lines, 1, out.stderr)
    self.assertStartsWith(lines[0], 'error: ValueError: positions range over [0, 7] but the '
                          'learned table has max_positions=4 rows')


if __name__ == '__main__':
  absltest.main()
