"""The benchmark suite end to end on the tiny preset (one shared run), its
workdir rules, resume from a checkpoint in the middle of a group, shards
and locks, and the paper preset built, lowered and stepped on CPU (its
config checks: tests/lab/config/test_suite_config.py)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest

from attention_jax.lab.protocols import encoder_layout
from attention_jax.lab.report import published
from attention_jax.lab.report import suite_report
from attention_jax.lab.config import suite_config
from attention_jax.lab.runs import suite
from attention_jax.lab.train import suite_programs
from attention_jax.lab.train import suite_trainer
from attention_jax.lab.runs import locks
from attention_jax.lab import tasks as lab_tasks
from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.tasks.chomsky import registry
from attention_jax.lab.errors import ConfigError
from configs import chomsky as chomsky_config

TASKS = ('parity_check', 'binary_addition')
ENCODINGS = ('alibi', 'rope:randomized', 'relative:randomized')


def tiny(**changes):
  c = chomsky_config.get_config('scale=tiny')
  c.study.tasks, c.study.encodings = TASKS, ENCODINGS
  for path, value in changes.items():
    group, _, key = path.rpartition('.')
    (c[group] if group else c)[key] = value
  return c


class EvaluationDropoutTest(chex.TestCase):
  """eval.deterministic=False keeps dropout on at evaluation, as theirs, with
  keys from eval.seed: the same scores every time; True turns it off."""

  def _scores(self, deterministic, seed=1):
    c = tiny(**{'model.dropout': 0.5, 'eval.deterministic': deterministic,
                'eval.num_samples': 32, 'eval.batch_size': 16, 'eval.seed': seed})
    task = lab_tasks.get_spec('parity_check')
    programs = suite_programs.Programs.for_tasks(c, [task])
    graphdef, params, rest = programs.models('alibi', [0])
    return suite_trainer.evaluate(programs, task, 'alibi', graphdef, params, rest)

  def test_dropout_at_evaluation_is_reproducible_and_switchable(self):
    on = self._scores(False)
    np.testing.assert_array_equal(on, self._scores(False))
    self.assertFalse(np.array_equal(on, self._scores(True)))

    self.assertFalse(np.array_equal(on, self._scores(False, seed=2)))

  def test_deterministic_is_a_bool_field_off_in_every_preset_as_theirs(self):
    for scale in ('tiny', 'cpu', 'paper'):
      self.assertIs(chomsky_config.get_config(f'scale={scale}').eval.deterministic, False)
    c = tiny()
    with self.assertRaises(TypeError):  # --config.eval.deterministic=yes: refused by its type
      c.eval.deterministic = 'yes'
    c.eval = dict(c.eval.to_dict(), deterministic='yes')  # a config built by hand
    with self.assertRaisesRegex(ConfigError, "eval.deterministic='yes' must be True"):
      suite_config.validate(c)


class SuiteRunTest(chex.TestCase):
  """One tiny suite run shared by every assertion (the slow part: compiling)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.workdir = tempfile.mkdtemp()
    cls.lines = []
    cls.records = suite.run_suite(tiny(), cls.workdir, progress=cls.lines.append)

  def test_every_setting_recorded_with_scores(self):
    self.assertLen(self.records, len(TASKS) * len(ENCODINGS))
    for r in self.records:
      acc = np.asarray(r['accuracies'])
      self.assertEqual(acc.shape, (2, 7))  # seeds × lengths 1 … 7
      self.assertTrue(np.all((acc >= 0) & (acc <= 1)))
      # Their score skips the first test length (train max 4: lengths 6, 7).
      np.testing.assert_allclose(r['per_seed'][0]['score_official'], acc[0, 5:].mean())
      np.testing.assert_allclose(r['per_seed'][0]['score_plain'], acc[0, 4:].mean())
      self.assertAlmostEqual(r['scores']['score_official']['max'],
                             max(s['score_official'] for s in r['per_seed']))

  def test_outputs_written(self):
    for name in ('results.csv', 'summary.md', 'chomsky.png', 'config.json'):
      self.assertTrue(os.path.exists(os.path.join(self.workdir, name)), name)
    summary = open(os.path.join(self.workdir, 'summary.md')).read()
    for name in TASKS + ENCODINGS:
      self.assertIn(name, summary)
    # DAPE's Table 2 beside ours: parity_check × randomized relative is 50.09 there.
    self.assertIn('## Beside the published numbers', summary)
    self.assertIn('/ 50.09', summary)
    rows = open(os.path.join(self.workdir, 'results.csv')).read().splitlines()
    self.assertLen(rows, 1 + len(TASKS) * len(ENCODINGS) * 2)

  def test_the_last_job_reads_the_records_other_jobs_made_meanwhile(self):
    # Jobs of an array that start together: one finds nothing recorded when
    # it starts, the others record every setting, and it writes the outputs.
    workdir = tempfile.mkdtemp()
    lines = []
    late = suite.Suite(tiny(), workdir, lines.append)
    self.assertIsNone(late.write_outputs())
    self.assertIn('settings are not recorded yet', lines[-1])
    shutil.copytree(os.path.join(self.workdir, 'settings'), os.path.join(workdir, 'settings'))
    records = late.write_outputs()
    self.assertEqual([(r['task'], r['encoding']) for r in records],
                     [(r['task'], r['encoding']) for r in self.records])
    self.assertTrue(os.path.exists(os.path.join(workdir, 'summary.md')))

  def test_progress_names_each_setting(self):
    self.assertTrue(any('parity_check × rope:randomized: score' in line for line in self.lines))
    self.assertTrue(any('min left' in line for line in self.lines))

  def test_rerun_skips_and_a_damaged_record_is_rerun(self):
    path = suite.record_path(self.workdir, 'parity_check', 'alibi', 1e-3)
    before = json.load(open(path))
    with open(path, 'w') as f:
      f.write('{"truncated')
    lines = []
    records = suite.run_suite(tiny(), self.workdir, progress=lines.append)
    self.assertTrue(os.path.exists(path + '.damaged'))
    self.assertTrue(any(path in line and 'damaged' in line for line in lines))
    self.assertIn(f'5 of 6 settings already recorded in {self.workdir}', lines[1])
    ran = [line for line in lines if line.startswith('[group')]
    self.assertLen(ran, 1)  # only the damaged one
    self.assertIn('alibi (lr 0.001) × parity_check;', ran[0])
    again = next(r for r in records if r['task'] == 'parity_check' and r['encoding'] == 'alibi')
    # Data from (seed, step), evaluation from eval.seed: the same numbers again.
    np.testing.assert_allclose(again['accuracies'], before['accuracies'])

  def _assert_same_as_the_shared_run(self, records):
    """Bit for bit: the accuracies, the training log and accuracy."""
    reference = {(r['task'], r['encoding']): r for r in self.records}
    self.assertNotEmpty(records)
    for r in records:
      ref = reference[(r['task'], r['encoding'])]
      np.testing.assert_array_equal(r['accuracies'], ref['accuracies'])
      self.assertEqual(r['log'], ref['log'])
      self.assertEqual(r['train_accuracy'], ref['train_accuracy'])

  def test_an_interrupted_group_resumes_bit_for_bit(self):
    workdir = tempfile.mkdtemp()
    one = {'study.encodings': ('rope:randomized',)}
    with self.assertRaisesRegex(TrainingInterrupted, r'train.stop_after at step 2 .*'
                                r'checkpointed at step 2 in .*groups/rope\+randomized/'
                                r'lr_0.001/parity_check/checkpoints'):
      suite.run_suite(tiny(**one, **{'train.stop_after': 2}), workdir, progress=lambda _: None)
    group = suite.group_dir(workdir, 'rope:randomized', 1e-3, ['parity_check'])
    self.assertEqual(os.listdir(os.path.join(group, 'checkpoints')), ['2'])
    lines = []
    records = suite.run_suite(tiny(**one, **{'train.tensorboard': True}), workdir,
                              progress=lines.append)
    self.assertTrue(any('resuming at step 2 from' in line for line in lines))
    self._assert_same_as_the_shared_run(records)
    # Every compiled call's metrics once, the interrupted one's kept: steps 2 and 4.
    with open(os.path.join(group, 'metrics.jsonl')) as f:
      rows = [json.loads(line) for line in f]
    self.assertEqual([r['step'] for r in rows], [2, 4])
    for row in rows:  # the mean is the members' (each task × seed of the group)
      members = [row[f'parity_check/seed{s}/loss'] for s in tiny().study.seeds]
      self.assertAlmostEqual(row['loss'], float(np.mean(np.float32(members))), places=5)
    self.assertAlmostEqual(rows[-1]['loss'], records[0]['log'][-1]['loss'], places=6)
    self.assertNotEmpty(os.listdir(os.path.join(group, 'tensorboard')))

  def test_two_shards_equal_one_process(self):
    # The shared run trains its groups two at a time (the tiny preset's
    # study.parallel_setups); each shard here trains one group alone, so the
    # equality below is also side by side against one after another.
    self.assertEqual(tiny().study.parallel_setups, 2)
    workdir, first = tempfile.mkdtemp(), []
    one = {'study.encodings': ('rope:randomized',)}
    self.assertIsNone(suite.run_suite(tiny(**one, **{'study.shard': (0, 2)}), workdir,
                                      progress=first.append))
    self.assertIn('shard 0 of 2: 1 of the 2 groups', first)
    self.assertTrue(any('1 of 2 settings are not recorded yet' in line for line in first))
    self.assertFalse(os.path.exists(os.path.join(workdir, 'summary.md')))
    with self.assertRaisesRegex(ConfigError, 'study.report_only: 1 of 2 settings'):
      suite.run_suite(tiny(**one, **{'study.report_only': True}), workdir,
                      progress=lambda _: None)
    records = suite.run_suite(tiny(**one, **{'study.shard': (1, 2)}), workdir,
                              progress=lambda _: None)
    self.assertTrue(os.path.exists(os.path.join(workdir, 'summary.md')))
    self._assert_same_as_the_shared_run(records)

  def test_a_group_another_job_holds_is_left_to_it(self):
    workdir, lines = tempfile.mkdtemp(), []
    config = tiny(**{'study.encodings': ('alibi',), 'study.tasks': ('parity_check',)})
    held, release = threading.Event(), threading.Event()

    def other_job():
      with locks.hold(suite.group_dir(workdir, 'alibi', 1e-3, ['parity_check'])):
        held.set()
        release.wait()
    thread = threading.Thread(target=other_job)
    thread.start()
    held.wait()
    try:
      self.assertIsNone(suite.run_suite(config, workdir, progress=lines.append))
    finally:
      release.set()
      thread.join()
    self.assertTrue(any('alibi (lr 0.001) × parity_check: in training by ' in line
                        and 'left to it' in line for line in lines), lines)

  def test_another_config_refused_in_the_same_workdir(self):
    with self.assertRaisesRegex(ConfigError, r'another config \(differing: model.d_model\)'):
      suite.run_suite(tiny(**{'model.d_model': 8}), self.workdir, progress=lambda _: None)


class ReportTest(chex.TestCase):

  def test_randomized_gains_per_encoding(self):
    score = lambda best, mean: dict(score_official=dict(max=best, mean=mean))
    combined = {('a', 'rope'): score(0.5, 0.4), ('a', 'rope:randomized'): score(0.7, 0.5),
                ('b', 'rope'): score(0.6, 0.6), ('b', 'rope:randomized'): score(0.5, 0.5),
                ('a', 'alibi'): score(0.5, 0.5)}  # no randomized alibi: no row
    lines = suite_report.randomized_gains(combined, ['a', 'b'], ['rope', 'alibi', 'rope:randomized'])
    self.assertEqual(lines[-1], '| rope | +5.0 | +0.0 | 1 of 2 |')
    self.assertFalse(any(line.startswith('| alibi') for line in lines))

  def test_published_cells_are_dape_table_2(self):
    self.assertEqual(published.dape_2024('even_pairs', 'rope:randomized'), 99.98)
    self.assertEqual(published.dape_2024('bucket_sort', 'fire:randomized'), 99.57)
    self.assertIsNone(published.dape_2024('binary_multiplication', 'rope:randomized'))
    self.assertIsNone(published.dape_2024('even_pairs', 'rope'))  # their table: randomized only
    self.assertEqual(set(published._DAPE_2024_ROWS) | {'binary_multiplication'},
                     set(registry.TASKS))


_DEVICES_SCRIPT = """
import json, sys, tempfile
import jax
from attention_jax.lab.config import suite_config
from attention_jax.lab.runs import suite
from attention_jax.lab.errors import ConfigError
from configs import chomsky as chomsky_config
c = chomsky_config.get_config('scale=tiny')
c.study.tasks, c.study.encodings = ('parity_check', 'reverse_string'), ('rope:randomized',)
c.eval.update(batch_size=4, num_samples=8)
records = suite.run_suite(c, tempfile.mkdtemp(), progress=lambda line: None)
out = dict(devices=jax.device_count(),
           records=[dict(task=r['task'], accuracies=r['accuracies'], log=r.get('log'))
                    for r in records])
c.eval.update(batch_size=2, num_samples=8)
try:
  suite_config.validate(c)
except ConfigError as e:
  out['refused'] = str(e)
print('RESULT' + json.dumps(out))
"""


@pytest.mark.slow  # two processes, one of them on 4 emulated devices
class DataParallelTest(chex.TestCase):

  def _run(self, devices):
    env = dict(os.environ, JAX_PLATFORMS='cpu',
               XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}')
    out = subprocess.run([sys.executable, '-c', _DEVICES_SCRIPT], env=env, timeout=900,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
                             os.path.abspath(__file__))))), capture_output=True, text=True)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    return json.loads(out.stdout.split('RESULT', 1)[1])

  def test_four_devices_train_and_score_as_one(self):
    one, four = self._run(1), self._run(4)
    self.assertEqual((one['devices'], four['devices']), (1, 4))
    self.assertEqual([r['task'] for r in one['records']], [r['task'] for r in four['records']])
    for a, b in zip(one['records'], four['records']):
      # The same training up to the order of the gradients' reductions: the
      # losses logged after every call, and the scores of the same models on
      # the same examples.
      for x, y in zip(a['log'] or [], b['log'] or []):
        self.assertAlmostEqual(x['loss'], y['loss'], places=5)
      np.testing.assert_allclose(a['accuracies'], b['accuracies'], atol=1e-6)
    self.assertNotIn('refused', one)  # one device divides every batch
    self.assertIn('eval.batch_size=2 is not divisible by the 4 devices', four['refused'])


class PaperPresetTest(chex.TestCase):
  """The published setting on CPU: built, lowered at its longest evaluation,
  and a few real training steps."""

  @pytest.mark.slow  # a paper-size model compiled on CPU: CI's slow tier
  def test_paper_preset_builds_lowers_and_steps(self):
    c = chomsky_config.get_config('scale=paper')
    self.assertEqual((c.model.num_layers, c.model.d_model, c.model.num_heads,
                      c.model.mlp_factor, c.model.dropout), (5, 64, 8, 4, 0.1))
    self.assertEqual((c.train.batch_size, c.task.train_min_length, c.task.train_max_length,
                      c.eval.max_length, c.eval.num_samples), (128, 1, 40, 500, 512))
    suite_config.validate(c)
    c.train.num_steps, c.train.steps_per_call = 2, 2
    task = lab_tasks.get_spec('duplicate_string')  # the longest layout: 3 × 500 slots
    programs = suite_programs.Programs.for_tasks(c, list(registry.TASKS.values()))
    graphdef, (params,), rest, log = suite_trainer.train(programs, [task], 'relative:randomized',
                                                   [0], 3e-4, progress=lambda _: None)
    self.assertTrue(np.isfinite(log['log'][-1]['loss']))
    slots = encoder_layout.padded_slots(task, c.eval.max_length)
    batches = programs.eval_data(task, slots, c.eval.max_length)(jnp.int32(c.eval.max_length))
    batches['num_classes'] = jnp.full((c.eval.num_samples // c.eval.batch_size, 1), 2,
                                      jnp.int32)
    self.assertEqual(batches['tokens'].shape, (8, 64, 1500))
    lowered = programs.eval_accuracy(graphdef, rest, 'relative:randomized', slots).lower(
        params, batches)
    self.assertIn('1500', str(lowered.out_info) + str(lowered.args_info))


if __name__ == '__main__':
  absltest.main()
