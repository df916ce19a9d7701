"""Bad input is refused, never read as something else: a batch asked for
inputs longer than it is padded for, and an evaluation range that cannot
fit (refused at config time, before any model trains)."""

import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import pytest
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab import eval_budget
from attention_jax.lab import tasks
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.tasks.batches import make_batch
from attention_jax.lab.tasks.batches import make_seq2seq_batch
from attention_jax.lab.validate import validate_config
from configs import copy as copy_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BatchLengthTest(parameterized.TestCase):

  @parameterized.parameters(([[12, 3]],), ([[3, 11]],), ([[0, 3]],))
  def test_addition_operand_past_the_padding_is_refused(self, lengths):
    with self.assertRaisesRegex(ValueError, 'outside 1 … max_input_length=10'):
      make_batch(tasks.get_task('addition'), jax.random.key(0), jnp.asarray(lengths, jnp.int32),
                 vocab_size=10, max_input_length=10)

  def test_copy_input_past_the_padding_is_refused(self):
    for build in (make_batch, make_seq2seq_batch):
      with self.assertRaisesRegex(ValueError, 'max_input_length=4'):
        build(tasks.get_task('copy'), jax.random.key(0), jnp.asarray([2, 5], jnp.int32),
              vocab_size=8, max_input_length=4)

  def test_lengths_within_the_padding_and_traced_ones_still_work(self):
    task = tasks.get_task('addition')
    batch = make_batch(task, jax.random.key(0), jnp.asarray([[10, 1]], jnp.int32),
                       vocab_size=10, max_input_length=10)
    traced = jax.jit(lambda n: make_batch(task, jax.random.key(0), n, vocab_size=10,
                                          max_input_length=10)['inputs'])
    self.assertEqual(traced(jnp.asarray([[10, 1]], jnp.int32)).shape, batch['inputs'].shape)


class EvaluationBudgetTest(absltest.TestCase):

  def test_an_evaluation_past_memory_is_refused_naming_the_field(self):
    c = copy_config.get_config('scale=tiny')
    c.eval.max_length = 100_000_000
    with self.assertRaisesRegex(ConfigError, r"eval.max_length=100000000 on 'copy'.*GiB, more "
                                r"than this machine's .*lower eval.max_length or eval.batch_size"):
      validate_config(c, study=True)

  def test_an_evaluation_past_the_work_limit_is_refused(self):
    c = copy_config.get_config('scale=tiny')
    c.eval.num_samples = 10 ** 15
    with self.assertRaisesRegex(ConfigError, 'eval.num_samples=1000000000000000 is about .* '
                                'FLOPs, above the limit of 6e\\+17'):
      eval_budget.check(c)

  def test_the_presets_fit(self):
    for scale in ('tiny', 'cpu', 'paper'):
      eval_budget.check(copy_config.get_config(f'scale={scale}'))


@pytest.mark.slow
class EntryPointTest(absltest.TestCase):

  def test_too_long_an_evaluation_is_one_line_exit_2_and_writes_nothing(self):
    workdir = os.path.join(tempfile.mkdtemp(), 'study')
    out = subprocess.run(
        [sys.executable, '-m', 'experiments.length_extrapolation',
         '--config=configs/copy.py:scale=tiny', '--config.eval.max_length=100000000',
         f'--workdir={workdir}'], cwd=ROOT, capture_output=True, text=True, timeout=240)
    self.assertEqual(out.returncode, 2, out.stderr[-2000:])
    self.assertIn('error: invalid config: eval.max_length=100000000', out.stderr)
    self.assertFalse(os.path.exists(workdir))


if __name__ == '__main__':
  absltest.main()
