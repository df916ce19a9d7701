"""`train.mesh`: the lab trains data parallel, FSDP or tensor parallel from
a config, the same training on each layout, every parameter where its rules
put it; bad layouts refused by name before anything compiles.

The multi-device test runs in a subprocess on 4 emulated CPU devices (XLA
reads `--xla_force_host_platform_device_count` once, when JAX starts)."""

import json
import os
import subprocess
import sys
import textwrap

import chex
import jax
import ml_collections
import pytest
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab.errors import ConfigError
from attention_jax.lab.train import mesh as train_mesh
from attention_jax.lab.config.validate import validate_config
from attention_jax.lab.config.resolved import resolve
from configs import copy as copy_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _tiny(**train):
  c = copy_config.get_config('scale=tiny')
  c.train.update(train)
  return c


class TrainMeshCheckTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('unknown_name', dict(mesh='fsdq'), r"train.mesh='fsdq'; choose one of 'data', 'fsdp', "
                                          r"'tensor'"),
      ('capitalised', dict(mesh='FSDP'), r"train.mesh='FSDP'; choose one of .* \(did you "
                                         r"mean 'fsdp'\?\)"),
      ('empty', dict(mesh=''), r"train.mesh=''; choose one of"),
      ('none', dict(mesh=None), r'train.mesh=None; choose one of'),
      ('number', dict(mesh=2), r'train.mesh=2; choose one of'),
      ('negative_parallel', dict(mesh='tensor', model_parallel=-1),
       r'train.model_parallel=-1 must be an integer >= 0'),
      ('bool_parallel', dict(mesh='tensor', model_parallel=True),
       r'train.model_parallel=True must be an integer >= 0'),
      ('float_parallel', dict(mesh='tensor', model_parallel=2.0),
       r'train.model_parallel=2.0 must be an integer >= 0'),
      ('parallel_without_tensor', dict(mesh='fsdp', model_parallel=2),
       r"train.model_parallel=2 is for train.mesh='tensor', not 'fsdp'"),
      ('parallel_not_dividing', dict(mesh='tensor', model_parallel=3),
       r'train.model_parallel=3 does not divide the 4 devices'),
      ('parallel_past_devices', dict(mesh='tensor', model_parallel=8),
       r'train.model_parallel=8 does not divide the 4 devices'),
  )
  def test_train_mesh_refuses_a_bad_layout_naming_it(self, train, message):
    fields = ml_collections.ConfigDict(dict(dict(mesh='data', model_parallel=0, batch_size=8),
                                            **train))
    with self.assertRaisesRegex(ConfigError, 'invalid config: ' + message):
      train_mesh.check(fields, 4)

  def test_train_mesh_is_checked_with_the_config(self):
    with self.assertRaisesRegex(ConfigError, r"invalid config: train.mesh='fsdq'; choose one "):
      validate_config(_tiny(mesh='fsdq'))
    with self.assertRaisesRegex(ConfigError, r'train.model_parallel=3 does not divide the 1 '):
      validate_config(_tiny(mesh='tensor', model_parallel=3))
    validate_config(_tiny(mesh='fsdp'))
    validate_config(_tiny(mesh='tensor', model_parallel=1))

  def test_train_mesh_batch_must_divide_the_batch_axis(self):
    with self.assertRaisesRegex(ConfigError, r'train.batch_size=6 is not divisible by the 4 '
                                             r"devices of the batch axis of train.mesh='fsdp'"):
      train_mesh.check(_tiny(mesh='fsdp', batch_size=6).train, 4)
    with self.assertRaisesRegex(ConfigError, r'train.batch_size=6 is not divisible by the 4 '
                                             r"devices of the batch axis of train.mesh='tensor'"):
      train_mesh.check(_tiny(mesh='tensor', model_parallel=2, batch_size=6).train, 8)  # (4, 2)
    train_mesh.check(_tiny(mesh='tensor', model_parallel=2, batch_size=6).train, 4)  # (2, 2)
    train_mesh.check(_tiny(mesh='tensor', batch_size=6).train, 4)  # (1, 4): no batch split

  def test_train_mesh_refuses_sharding_a_model_without_named_axes(self):
    c = _tiny(mesh='fsdp')
    c.model.kind = 'seq2seq'
    with self.assertRaisesRegex(ConfigError, r"train.mesh='fsdp' shards the transformer's "
                                             r"named parameter axes; model.kind='seq2seq' has "
                                             r"none: use train.mesh='data'"):
      validate_config(c)

  @parameterized.named_parameters(('fsdp', 'fsdp', (4,), ('fsdp',)),
                                  ('tensor', 'tensor', (1, 4), ('data', 'model')))
  def test_train_mesh_names_a_weight_its_axis_does_not_divide(self, name, shape, axes):
    from attention_jax.lab.protocols import decoder
    from flax import nnx
    c = _tiny(mesh=name)
    c.model.update(d_model=30, num_heads=5, mlp_dim=60)  # 30, 5 heads: not multiples of 4
    model = resolve(c).build_model(0)
    state = nnx.state(model)
    specs = train_mesh.state_specs(state, train_mesh.rules_of(c.train))
    mesh = jax.sharding.AbstractMesh(shape, axes)
    with self.assertRaisesRegex(ConfigError, rf"train.mesh='{name}' splits \S+ \(shape .*\) "
                                             r'over mesh axis .* of 4 devices, which does not '
                                             r'divide its size (30|5)'):
      train_mesh.check_divides(state, specs, mesh, name)

  def test_train_mesh_is_not_part_of_a_runs_identity(self):
    from attention_jax.lab.config import identity
    self.assertTrue(any('train.mesh'.startswith(k) for k in identity.NOT_TRAINING))
    self.assertTrue(any('train.model_parallel'.startswith(k) for k in identity.NOT_TRAINING))


_SCRIPT = textwrap.dedent('''
    import json, sys
    import jax, numpy as np
    from flax import nnx
    from attention_jax.lab.train import loop
    from attention_jax.lab.train import mesh as train_mesh
    from attention_jax.nn import sharding
    from configs import copy as copy_config
    assert jax.device_count() == 4, jax.device_count()

    def config(layout, parallel=0, seed=0):
      c = copy_config.get_config('scale=tiny')
      c.model.num_heads = 4  # a head per device on a 'model' axis of 4
      c.train.update(mesh=layout, model_parallel=parallel, num_steps=6, steps_per_call=2,
                     log_every=2, seed=seed)
      return c

    def params(model):
      return {'/'.join(map(str, p)): np.asarray(v[...]) for p, v in
              nnx.to_flat_state(nnx.state(model, nnx.Param))}

    def trimmed(spec):  # a spec's axes, trailing Nones (unsplit axes) left out
      axes = list(spec)
      while axes and axes[-1] is None:
        axes.pop()
      return axes

    def specs(model):
      return {'/'.join(map(str, p)): trimmed(v[...].sharding.spec) for p, v in
              nnx.to_flat_state(nnx.state(model, nnx.Param))}

    def gap(a, b):
      return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)

    out = {}
    base_model, base_metrics = loop.train(config('data'))
    base = params(base_model)
    for name, layout, parallel in (('fsdp', 'fsdp', 0), ('tensor', 'tensor', 2),
                                   ('tensor_all', 'tensor', 4)):
      model, metrics = loop.train(config(layout, parallel))
      out[name] = dict(gap=gap(base, params(model)), loss=metrics['loss'],
                       base_loss=base_metrics['loss'], specs=specs(model))
    seeds = [config('data', seed=s) for s in (0, 1)]
    stacked = loop.train_seeds(seeds, [None, None], progress=False)
    sharded = loop.train_seeds([config('fsdp', seed=s) for s in (0, 1)], [None, None],
                               progress=False)
    out['seeds_fsdp'] = dict(gap=max(gap(params(a[0]), params(b[0]))
                                     for a, b in zip(stacked, sharded)),
                             seed0_vs_alone=gap(base, params(sharded[0][0])))
    # The study from a config: trained and evaluated on an FSDP mesh, the rows
    # of the data-parallel study's results.csv.
    import csv, os, tempfile
    from attention_jax.lab.runs.study import run_study
    tables = {}
    for layout in ('data', 'fsdp'):
      c = config(layout)
      c.study.encodings = ('rope',)
      workdir = tempfile.mkdtemp()
      run_study(c, workdir, log=lambda *_: None)
      with open(os.path.join(workdir, 'results.csv')) as f:
        tables[layout] = [{k: r[k] for k in ('length', 'token_accuracy', 'exact_match')}
                          for r in csv.DictReader(f)]
    out['study_rows_equal'] = tables['data'] == tables['fsdp']
    out['study_rows'] = len(tables['data'])
    # The config checks split the batch over the layout's batch axis only:
    # 6 sequences over (data, model) = (2, 2) is valid, over 4 data devices not.
    from attention_jax.lab.config.validate import validate_config
    six = config('tensor', 2)
    six.train.batch_size = 6
    validate_config(six)
    six.train.update(mesh='data', model_parallel=0)
    try:
      validate_config(six)
    except Exception as e:
      out['six_on_data'] = str(e)
    odd = config('tensor', 4)
    odd.model.num_heads = 2  # two heads over a 'model' axis of 4
    try:
      loop.train(odd)
    except Exception as e:
      out['refused'] = f'{type(e).__name__}: {e}'
    print('RESULT' + json.dumps(out))
''')


@pytest.mark.slow
class FourDeviceTrainingTest(chex.TestCase):

  def test_train_mesh_layouts_train_alike_on_four_devices(self):
    env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=4',
               JAX_PLATFORMS='cpu')
    out = subprocess.run([sys.executable, '-c', _SCRIPT], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    result = json.loads(out.stdout.split('RESULT', 1)[1])
    for name in ('fsdp', 'tensor', 'tensor_all'):
      # Six AdamW steps from the same init on the same batches: the same
      # parameters up to the order of the gradient reductions.
      self.assertLess(result[name]['gap'], 1e-5, name)
      self.assertAlmostEqual(result[name]['loss'], result[name]['base_loss'], places=5)
    fsdp, tensor = result['fsdp']['specs'], result['tensor_all']['specs']
    w_q = next(k for k in fsdp if k.endswith('W_Q/kernel'))
    self.assertEqual(fsdp[w_q], ['fsdp'])  # [embed, heads, kv]: embed split
    self.assertEqual(tensor[w_q], [None, 'model'])  # heads split
    w_o = next(k for k in tensor if k.endswith('W_O/kernel'))
    self.assertEqual(tensor[w_o], ['model'])  # [heads, kv, embed]: heads split
    self.assertLess(result['seeds_fsdp']['gap'], 1e-5)  # stacked seeds, FSDP = data parallel
    self.assertLess(result['seeds_fsdp']['seed0_vs_alone'], 1e-5)
    self.assertTrue(result['study_rows_equal'])  # the study from the config, evaluated alike
    self.assertGreater(result['study_rows'], 0)
    self.assertIn("train.batch_size=6 is not divisible by the 4 devices of the batch axis of "
                  "train.mesh='data'", result['six_on_data'])
    self.assertRegex(result['refused'], r"ConfigError: invalid config: train.mesh='tensor' "
                                        r'splits \S+W_[KQV]\S* \(shape \(16, 2, 8\)\) '
                                        r"over mesh axis 'model' of 4 devices")


if __name__ == '__main__':
  absltest.main()
