"""Research-grade runs: resume, interruption, determinism, devices, provenance."""

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import chex
import ml_collections
import numpy as np
from absl.testing import absltest
import pytest
from flax import nnx

from attention_jax.lab import train
from attention_jax.lab.runs.plan import config_hash
from attention_jax.lab.runs.plan import run_configs
from attention_jax.lab.runs.study import run_study
from attention_jax.lab.train.checkpoint import Checkpointer
from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.config.resolved import resolve
from configs import copy as copy_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _config(**train_overrides):
  c = copy_config.get_config('scale=tiny,encoding=alibi')
  c.train.update(**dict(dict(num_steps=12, checkpoint_every=4, log_every=3), **train_overrides))
  return c


def _params(model):
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _metric_lines(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  for r in rows:
    r.pop('steps_per_second')  # wall-clock, the only field allowed to differ
  return rows


class ResumeTest(absltest.TestCase):

  def test_stop_and_resume_equals_straight_run_bitwise(self):
    straight_dir, resumed_dir = tempfile.mkdtemp(), tempfile.mkdtemp()
    straight, _ = train.train(_config(), straight_dir, progress=False)
    with self.assertRaisesRegex(TrainingInterrupted, 'after step 6 of 12; checkpoint saved'):
      train.train(_config(stop_after=6, tensorboard=True), resumed_dir, progress=False)
    self.assertEqual(sorted(os.listdir(os.path.join(resumed_dir, 'checkpoints'))), ['4', '6'])
    resumed, _ = train.train(_config(tensorboard=True), resumed_dir, progress=False)
    chex.assert_trees_all_equal(_params(straight), _params(resumed))
    self.assertEqual(_metric_lines(straight_dir), _metric_lines(resumed_dir))
    self.assertEqual([r['step'] for r in _metric_lines(resumed_dir)], list(range(12)))
    self.assertNotEmpty(glob.glob(os.path.join(resumed_dir, 'tensorboard', 'events.out.*')))
    # A finished run is not retrained: nothing changes on a third call.
    again, last = train.train(_config(), resumed_dir, progress=False)
    self.assertEqual(last, {})
    chex.assert_trees_all_equal(_params(straight), _params(again))
    self.assertEqual(_metric_lines(straight_dir), _metric_lines(resumed_dir))

  @pytest.mark.slow
  def test_several_steps_per_call(self):
    """Steps fused into one compiled call: every step still logged, resume
    still bitwise, and the same training as one step per call."""
    kw = dict(steps_per_call=2, log_every=4)
    straight_dir, resumed_dir = tempfile.mkdtemp(), tempfile.mkdtemp()
    straight, _ = train.train(_config(**kw), straight_dir, progress=False)
    with self.assertRaisesRegex(TrainingInterrupted, 'after step 6 of 12'):
      train.train(_config(stop_after=6, **kw), resumed_dir, progress=False)
    resumed, _ = train.train(_config(**kw), resumed_dir, progress=False)
    chex.assert_trees_all_equal(_params(straight), _params(resumed))
    self.assertEqual(_metric_lines(straight_dir), _metric_lines(resumed_dir))
    self.assertEqual([r['step'] for r in _metric_lines(straight_dir)], list(range(12)))
    one_per_call, _ = train.train(_config(log_every=4), None, progress=False)
    chex.assert_trees_all_close(_params(straight), _params(one_per_call), atol=1e-6)
    with self.assertRaisesRegex(ValueError, 'train.stop_after=5 is not a multiple of '
                                'train.steps_per_call=2'):
      from attention_jax.lab.config.validate import validate_config  # pylint: disable=g-import-not-at-top
      validate_config(_config(stop_after=5, **kw))

  def test_half_written_checkpoint_is_ignored(self):
    workdir = tempfile.mkdtemp()
    with self.assertRaises(TrainingInterrupted):
      train.train(_config(stop_after=4), workdir, progress=False)
    # What an interrupted orbax save leaves behind: a temporary folder.
    junk = os.path.join(workdir, 'checkpoints', '8.orbax-checkpoint-tmp-1234567')
    os.makedirs(junk)
    with open(os.path.join(junk, 'partial'), 'w') as f:
      f.write('not a checkpoint')
    model = resolve(_config()).build_model(0)
    optimizer = nnx.Optimizer(model, train.make_optimizer(_config().train), wrt=nnx.Param)
    _, state = nnx.split((model, optimizer))
    checkpointer = Checkpointer(os.path.join(workdir, 'checkpoints'), every=4, keep=2)
    _, step = checkpointer.restore_latest(state)
    checkpointer.close()
    self.assertEqual(step, 4)

  def test_same_config_and_seed_are_bitwise_identical(self):
    a, _ = train.train(_config(), progress=False)
    b, _ = train.train(_config(), progress=False)
    chex.assert_trees_all_equal(_params(a), _params(b))
    c, _ = train.train(_config(seed=1), progress=False)
    self.assertFalse(np.array_equal(_params(a)['unembed']['kernel'],
                                    _params(c)['unembed']['kernel']))


class ProvenanceTest(absltest.TestCase):

  def test_config_hash_groups_seeds_and_separates_setups(self):
    c = copy_config.get_config()
    hashes = {(r.model.encoding, r.train.seed): config_hash(r) for r in run_configs(c)}
    self.assertEqual(hashes[('rope', 0)], hashes[('rope', 2)])
    self.assertNotEqual(hashes[('rope', 0)], hashes[('alibi', 0)])
    c2 = copy_config.get_config()
    c2.train.learning_rate = 1e-4
    self.assertNotEqual(config_hash(run_configs(c2)[0]), config_hash(run_configs(c)[0]))

  def test_layer_indices_are_one_config_however_written(self):
    hashes = set()
    for written in ('(0,)', '0', ' ( 0 , ) ', (0,), [0]):
      # A plain dict's config (a variant's, a file's own) takes a tuple too.
      c = ml_collections.ConfigDict(copy_config.get_config('encoding=rope,scale=tiny').to_dict())
      c.model.encoding_layers = written
      hashes.add(config_hash(c))
    self.assertLen(hashes, 1)
    c = copy_config.get_config('encoding=rope,scale=tiny')
    c.model.encoding_layers = '1'
    self.assertNotIn(config_hash(c), hashes)  # another layer is another model


def _run(args, **kwargs):
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=240, **kwargs)


class ProcessTest(absltest.TestCase):
  """Behaviour that needs its own process: signals, fake devices, flags."""

  @pytest.mark.slow
  def test_sigterm_saves_a_checkpoint_and_exits_cleanly(self):
    workdir = tempfile.mkdtemp()
    proc = subprocess.Popen(
        [sys.executable, '-m', 'experiments.train', '--config=configs/copy.py:scale=tiny',
         '--config.train.num_steps=1000000', '--config.train.log_every=20',
         f'--workdir={workdir}'], cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True)
    metrics = os.path.join(workdir, 'metrics.jsonl')
    deadline = time.time() + 180
    while time.time() < deadline and not (os.path.exists(metrics) and os.path.getsize(metrics)):
      time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    self.assertEqual(proc.returncode, 128 + signal.SIGTERM, stderr[-2000:])
    self.assertIn('stopped by signal 15', stderr)
    self.assertIn('run the same command again to resume', stderr)
    steps = [int(s) for s in os.listdir(os.path.join(workdir, 'checkpoints')) if s.isdigit()]
    self.assertNotEmpty(steps)
    self.assertNotIn('Traceback', stderr)

  @pytest.mark.slow
  def test_four_devices_equal_one_device(self):
    script = textwrap.dedent('''
        import jax, jax.numpy as jnp, numpy as np
        from flax import nnx
        from jax.sharding import NamedSharding, PartitionSpec as P
        from attention_jax.lab import tasks
        from attention_jax.lab import train
        from attention_jax.lab.config.resolved import resolve
        from attention_jax.lab.train.step import step_function
        from attention_jax.lab.config.validate import validate_config
        from configs import copy as cc
        assert jax.device_count() == 4, jax.devices()
        c = cc.get_config('scale=tiny,encoding=rope')
        c.train.batch_size = 8
        results = []
        for devices in (jax.devices()[:1], jax.devices()):
          mesh = jax.make_mesh((len(devices),), ('data',), devices=devices,
                               axis_types=(jax.sharding.AxisType.Auto,))
          model = resolve(c).build_model(0)
          opt = nnx.Optimizer(model, train.make_optimizer(c.train), wrt=nnx.Param)
          graphdef, state = nnx.split((model, opt))
          state = jax.device_put(state, NamedSharding(mesh, P()))
          step = step_function(
              graphdef=graphdef, task=tasks.get_task('copy'), batch_size=8, min_length=1,
              max_length=4, vocab_size=c.task.vocab_size, layout='decoder_only',
              data_sharding=NamedSharding(mesh, P('data')))
          state, metrics = step(state, jnp.int32(0), jnp.int32(0))
          results.append((nnx.to_pure_dict(state), metrics))
        diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
                             *jax.device_get(results))
        print('MAXDIFF', max(jax.tree.leaves(diffs)))
        train.train(c, progress=False)  # the whole loop on 4 devices
        c.train.batch_size = 6
        try:
          validate_config(c)
        except ValueError as e:
          print('ERROR', e)
        ''')
    env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=4',
               JAX_PLATFORMS='cpu')
    out = _run(['-c', script], env=env)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    max_diff = float(out.stdout.split('MAXDIFF')[1].split()[0])
    self.assertLessEqual(max_diff, 1e-6)
    self.assertIn('train.batch_size=6 is not divisible by the 4 devices', out.stdout)

  def test_wrong_type_is_named(self):
    out = _run(['-m', 'experiments.train', '--config=configs/copy.py:scale=tiny',
                '--config.train.batch_size=abc', f'--workdir={tempfile.mkdtemp()}'])
    self.assertNotEqual(out.returncode, 0)
    self.assertIn('--config.train.batch_size=abc', out.stderr)

  @pytest.mark.slow
  def test_plot_redraws_and_combines_workdirs(self):
    workdirs = []
    for encoding in ('rope', 'none'):
      c = copy_config.get_config(f'scale=tiny,encoding={encoding}')
      workdirs.append(tempfile.mkdtemp())
      run_study(c, workdirs[-1], log=lambda _: None)
    out_dir = tempfile.mkdtemp()
    out = _run(['-m', 'experiments.plot', *(f'--workdir={w}' for w in workdirs),
                f'--out={out_dir}'])
    self.assertEqual(out.returncode, 0, out.stderr[-2000:])
    for name in ('extrapolation.png', 'training_curves.png'):
      self.assertGreater(os.path.getsize(os.path.join(out_dir, name)), 10_000, name)

  def test_plot_keeps_a_retrained_sibling_apart(self):
    from attention_jax.lab.report import result_files
    from experiments import plot
    workdir = tempfile.mkdtemp()
    for seed_dir, accuracy in (('seed0', 0.25), ('seed0-2', 0.75), ('seed1', 0.5)):
      run_dir = os.path.join(workdir, 'copy', 'rope', seed_dir)
      os.makedirs(run_dir)
      row = dict(task='copy', encoding='rope', seed=int(seed_dir[4]), length=8,
                 token_accuracy=accuracy, exact_match=accuracy, generated_exact_match='',
                 generation_agreement='', config_hash='h', version='v', diverged_at='',
                 num_steps='', hard_exact_match='')
      with open(os.path.join(run_dir, 'results.csv'), 'w') as f:
        f.write(','.join(result_files.FIELDS) + '\n')
        f.write(','.join(str(row[k]) for k in result_files.FIELDS) + '\n')
    by_label = {}
    for r in plot._rows(workdir):  # pylint: disable=protected-access
      by_label.setdefault(r['encoding'], []).append(r['token_accuracy'])
    self.assertEqual(by_label, {'rope': [0.25, 0.5], 'rope (retrain 2)': [0.75]})

  def test_unknown_config_key_is_named(self):
    out = _run(['-m', 'experiments.train', '--config=configs/copy.py:scale=tiny',
                '--config.train.batchsize=4', f'--workdir={tempfile.mkdtemp()}'])
    self.assertNotEqual(out.returncode, 0)
    self.assertIn('batchsize', out.stderr)


if __name__ == '__main__':
  absltest.main()
