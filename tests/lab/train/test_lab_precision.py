"""model.dtype / model.param_dtype in the lab: bfloat16 is one flag, float32
parameters by default, older run directories still resume."""

import json
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

from attention_jax.lab import evaluate
from attention_jax.lab.config import identity
from attention_jax.lab.config import facts
from attention_jax.lab import train
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.config.validate import validate_config
from attention_jax.lab.config.resolved import resolve
from configs import copy as copy_config


def _tiny(dtype='float32', param_dtype='float32', **model):
  c = copy_config.get_config('scale=tiny,encoding=rope')
  c.model.update(dtype=dtype, param_dtype=param_dtype, **model)
  return c


def _param_dtypes(model) -> set:
  return {leaf.dtype for leaf in jax.tree.leaves(nnx.state(model, nnx.Param))}


class LabPrecisionTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # One short training per precision, shared: enough steps for the loss to move.
    cls.trained = {}
    for dtype in ('float32', 'bfloat16'):
      c = _tiny(dtype, d_model=32, num_heads=2, num_layers=2, mlp_dim=64)
      c.train.update(num_steps=40, log_every=40, warmup_steps=4, batch_size=16)
      cls.trained[dtype] = train.train(c, progress=False) + (c,)

  def test_lab_precision_params_float32_by_default(self):
    self.assertEqual(_param_dtypes(resolve(_tiny()).build_model(0)), {jnp.dtype(jnp.float32)})
    model = self.trained['bfloat16'][0]
    self.assertEqual(model.dtype, jnp.bfloat16)
    self.assertEqual(_param_dtypes(model), {jnp.dtype(jnp.float32)})  # master weights
    stored = resolve(_tiny('bfloat16', 'bfloat16')).build_model(0)
    self.assertEqual(_param_dtypes(stored), {jnp.dtype(jnp.bfloat16)})

  def test_lab_precision_bf16_training_close_to_f32(self):
    (_, f32, _), (bf16_model, bf16, c) = self.trained['float32'], self.trained['bfloat16']
    self.assertLess(f32['loss'], 2.6)  # it learned something (ln 20 ≈ 3.0 at the start)
    np.testing.assert_allclose(bf16['loss'], f32['loss'], rtol=0.02)
    self.assertNotEqual(bf16['loss'], f32['loss'])  # bfloat16 did compute: not a no-op
    # The bf16 model evaluates and generates (cache included); logits are float32.
    rows = evaluate.evaluate_lengths(bf16_model, facts.configured_task(c), [3], train_max=4,
                                     num_samples=4, vocab_size=c.task.vocab_size, generate=True)
    self.assertTrue(all(np.isfinite(r['token_accuracy']) for r in rows))
    logits = bf16_model(jnp.ones((1, 5), jnp.int32))
    self.assertEqual(logits.dtype, jnp.float32)

  def test_lab_precision_seq2seq_builds_in_bf16(self):
    c = _tiny('bfloat16')
    c.model.kind = 'seq2seq'
    model = resolve(c).build_model(0)
    self.assertEqual(_param_dtypes(model), {jnp.dtype(jnp.float32)})

  @parameterized.named_parameters(
      ('float16', 'dtype', 'float16'), ('short_name', 'dtype', 'bf16'),
      ('param_int', 'param_dtype', 'int8'))
  def test_lab_precision_config_errors(self, field, value):
    c = _tiny()
    c.model[field] = value
    with self.assertRaisesRegex(ConfigError, rf"model.{field}='{value}'; allowed: "
                                r"\['float32', 'bfloat16'\]"):
      validate_config(c)

  def test_lab_precision_old_run_directory_still_matches(self):
    c = _tiny()
    with tempfile.TemporaryDirectory() as run_dir:
      old = c.to_dict()
      for section, field in (('model', 'dtype'), ('model', 'param_dtype'),
                             ('task', 'pack_segments')):
        del old[section][field]  # a config.json written before these fields existed
      with open(os.path.join(run_dir, 'config.json'), 'w') as f:
        json.dump(old, f, default=list)
      os.makedirs(os.path.join(run_dir, 'checkpoints', '5'))
      self.assertIsNone(identity.mismatch(run_dir, c))
      self.assertIn("model.dtype='float32', this config has 'bfloat16'",
                    identity.mismatch(run_dir, _tiny('bfloat16')))


if __name__ == '__main__':
  absltest.main()
