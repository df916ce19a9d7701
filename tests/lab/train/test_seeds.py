"""Every seed of one setup in one compiled program (`train_seeds`)."""

import os
import subprocess
import sys
import tempfile
import textwrap

import chex
import jax
import numpy as np
from absl.testing import absltest
import pytest
from flax import nnx

from attention_jax.lab import train
from attention_jax.lab.runs.study import run_study
from attention_jax.lab.train.interrupt import TrainingInterrupted
from configs import copy as copy_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SEEDS = (0, 1, 2)


def _configs(**train_overrides):
  out = []
  for seed in SEEDS:
    c = copy_config.get_config('scale=tiny,encoding=alibi')
    c.train.update(num_steps=100, steps_per_call=10, log_every=50, checkpoint_every=50,
                   warmup_steps=10, **train_overrides)
    c.train.seed = seed
    out.append(c)
  return out


def _params(model):
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _losses(workdir):
  import json  # pylint: disable=g-import-not-at-top
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line)['loss'] for line in f]


class VmappedSeedsTest(absltest.TestCase):

  @pytest.mark.slow
  def test_vmapped_seeds_equal_sequential_runs_and_resume_bitwise(self):
    """100 steps: every leaf of every seed within relative 1e-5 of its
    sequential run, and the same per-step losses; a vmapped run stopped at
    step 50 and resumed ends bit for bit where the straight one did (one
    straight vmapped training serves both checks)."""
    seq_dirs = [tempfile.mkdtemp() for _ in SEEDS]
    vm_dirs = [tempfile.mkdtemp() for _ in SEEDS]
    sequential = [train.train(c, d, progress=False)[0] for c, d in zip(_configs(), seq_dirs)]
    vmapped = [m for m, _ in train.train_seeds(_configs(), vm_dirs, progress=False)]
    for seq, vm, sd, vd in zip(sequential, vmapped, seq_dirs, vm_dirs):
      for a, b in zip(jax.tree.leaves(_params(seq)), jax.tree.leaves(_params(vm))):
        scale = max(float(np.max(np.abs(a))), 1e-30)
        self.assertLessEqual(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) / scale, 1e-5)
      self.assertLen(_losses(vd), 100)
      np.testing.assert_allclose(_losses(sd), _losses(vd), rtol=1e-5)
      self.assertEqual(sorted(os.listdir(os.path.join(vd, 'checkpoints'))), ['100', '50'])

    resumed = [tempfile.mkdtemp() for _ in SEEDS]
    with self.assertRaisesRegex(TrainingInterrupted, 'after step 50 of 100'):
      train.train_seeds(_configs(stop_after=50), resumed, progress=False)
    again = train.train_seeds(_configs(), resumed, progress=False)
    for a, (b, _), da, db in zip(vmapped, again, vm_dirs, resumed):
      chex.assert_trees_all_equal(_params(a), _params(b))
      self.assertEqual(_losses(da), _losses(db))

  @pytest.mark.slow
  def test_study_switches_give_the_same_rows(self):
    """`study.vmap_seeds` on and off: the same results.csv accuracies;
    `study.parallel_setups` 2 and 1: the same rows, bit for bit."""
    rows = {}
    for vmapped, parallel in ((True, 2), (True, 1), (False, 1)):
      c = copy_config.get_config('scale=tiny')
      c.study.encodings = ('alibi', 'rope')
      c.study.seeds, c.study.vmap_seeds, c.study.parallel_setups = (0, 1), vmapped, parallel
      c.eval.update(max_length=4, generate=False)  # one bucket, one program: fewer compiles
      messages = []
      rows[vmapped, parallel] = run_study(c, tempfile.mkdtemp(), log=messages.append)
      self.assertEqual(sum('in one program' in m for m in messages), 2 * vmapped)
    self.assertEqual(rows[True, 2], rows[True, 1])
    self.assertLen(rows[True, 1], 2 * 2 * 4)  # encodings x seeds x lengths
    for a, b in zip(rows[True, 1], rows[False, 1]):
      self.assertEqual((a['encoding'], a['seed'], a['length']),
                       (b['encoding'], b['seed'], b['length']))
      self.assertAlmostEqual(a['token_accuracy'], b['token_accuracy'], places=6)

  @pytest.mark.slow
  def test_seed_axis_on_four_devices(self):
    """4 seeds on 4 (fake CPU) devices: the seed axis is the mesh axis and
    every seed equals its single-device run."""
    script = textwrap.dedent('''
        import tempfile, jax, numpy as np
        from flax import nnx
        from attention_jax.lab import train
        from configs import copy as cc
        assert jax.device_count() == 4
        configs = []
        for seed in range(4):
          c = cc.get_config('scale=tiny,encoding=alibi')
          c.train.update(num_steps=20, steps_per_call=10, log_every=10, seed=seed, batch_size=8)
          configs.append(c)
        vm = train.train_seeds(configs, [None] * 4, progress=False)
        worst = 0.0
        for c, (m, _) in zip(configs, vm):
          ref, _ = train.train(c, None, progress=False)
          for a, b in zip(jax.tree.leaves(nnx.state(ref, nnx.Param)),
                          jax.tree.leaves(nnx.state(m, nnx.Param))):
            worst = max(worst, float(np.max(np.abs(np.asarray(a) - np.asarray(b)))))
        print('MAXDIFF', worst)
        ''')
    env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=4',
               JAX_PLATFORMS='cpu', PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, '-c', script], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    self.assertLessEqual(float(out.stdout.split('MAXDIFF')[1].split()[0]), 1e-5)


if __name__ == '__main__':
  absltest.main()
