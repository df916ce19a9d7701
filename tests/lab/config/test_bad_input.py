"""Bad input is refused, never read as something else: a batch asked for
inputs longer than it is padded for, Abacus ids past a run's table (under
`jit` too, and named by operand in `predict`), and an evaluation range that
cannot fit (refused at config time, before any model trains)."""

import os
import re
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

from attention_jax.lab.evaluate import eval_budget
from attention_jax.lab.config import facts
from attention_jax.lab import tasks
from attention_jax.lab import trained
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.tasks.batches import make_batch
from attention_jax.lab.tasks.batches import make_seq2seq_batch
from attention_jax.lab.config.validate import validate_config
from attention_jax.lab.config import suite_config
from attention_jax.lab.protocols.encoder_layout import encoder_batch
from attention_jax.lab.config.resolved import resolve
from configs import addition as addition_config
from configs import chomsky as chomsky_config
from configs import copy as copy_config
from configs import flipflop as flipflop_config
from configs import seq2seq as seq2seq_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


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

  def test_every_builder_of_every_task_refuses_lengths_past_its_padding(self):
    for name, task in tasks.TASKS.items():
      pair = name == 'addition'
      for bad in (5, 0):
        lengths = jnp.asarray([[bad, 1]] if pair else [bad], jnp.int32)
        builders = [('make_batch', lambda: make_batch(task, jax.random.key(0), lengths,
                                                      vocab_size=10, max_input_length=4)),
                    ('example', lambda: task.example(jax.random.key(0), lengths, 10, 4))]
        if task.has_seq2seq:
          builders.append(('seq2seq', lambda: make_seq2seq_batch(
              task, jax.random.key(0), lengths, vocab_size=10, max_input_length=4)))
        if name in tasks.SPECS:
          builders.append(('encoder', lambda: encoder_batch(
              tasks.get_spec(name), jax.random.key(0), bad, batch_size=2, max_length=4)))
        for builder, build in builders:
          with self.subTest(task=name, builder=builder, length=bad):
            with self.assertRaisesRegex(ValueError, 'outside 1 … max_input_length=4'):
              build()

  def test_lengths_within_the_padding_and_traced_ones_still_work(self):
    task = tasks.get_task('addition')
    batch = make_batch(task, jax.random.key(0), jnp.asarray([[10, 1]], jnp.int32),
                       vocab_size=10, max_input_length=10)
    traced = jax.jit(lambda n: make_batch(task, jax.random.key(0), n, vocab_size=10,
                                          max_input_length=10)['inputs'])
    self.assertEqual(traced(jnp.asarray([[10, 1]], jnp.int32)).shape, batch['inputs'].shape)


class AbacusRangeTest(absltest.TestCase):
  """A run's model (untrained: the range is the table's, not the weights')."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    c = facts.resolve_options(addition_config.get_config('scale=tiny,encoding=fire:abacus'))
    cls.abacus_run = trained.Trained(model=resolve(c).build_model(0), config=c,
                              task=facts.configured_task(c), run_dir='untrained')
    cls.rows = cls.abacus_run.model.abacus.rows

  def test_ids_past_the_table_under_jit_are_an_error_not_pad(self):
    number = jnp.full((1, self.rows), tasks.NUM_SPECIAL + 7, jnp.int32)  # ids 1 … rows
    forward = nnx.jit(lambda model, t: model(t))
    with self.assertRaisesRegex(Exception, f'Abacus ids reach {self.rows} .* {self.rows} rows'):
      jax.block_until_ready(forward(self.abacus_run.model, number))
    self.assertTrue(np.all(np.isfinite(forward(self.abacus_run.model, number[:, 1:]))))

  def test_predict_names_the_operands_past_the_table(self):
    longest = self.rows - 2  # operand digits whose sum's digits all have rows
    with self.assertRaisesRegex(ValueError, f'predict\\(a={10 ** longest}, b=0\\): its answer can '
                                f'have {self.rows} digits.* at most {longest} digits'):
      self.abacus_run.predict(10 ** longest, 0)
    self.assertIsNotNone(self.abacus_run.predict(10 ** (longest - 1), 0).tokens)


def _budget_configs():
  """(name, config, check) of each study kind, evaluation to 10^8 input symbols."""
  def huge(module, arg, **fields):
    c = module.get_config(arg)
    for k, v in fields.items():
      setattr(c.model, k, v)
    c.eval.max_length = 100_000_000
    return c
  return (('copy', huge(copy_config, 'scale=tiny'), eval_budget.check),
          ('addition', huge(addition_config, None), eval_budget.check),
          ('seq2seq', huge(seq2seq_config, None, kind='seq2seq_attention'), eval_budget.check),
          ('chomsky', huge(chomsky_config, None), eval_budget.check_encoder))


class EvaluationBudgetTest(parameterized.TestCase):

  def test_an_evaluation_past_memory_is_refused_naming_the_field(self):
    c = copy_config.get_config('scale=tiny')
    c.eval.max_length = 100_000_000
    with self.assertRaisesRegex(ConfigError, r"eval.max_length=100000000 on 'copy'.*GiB, more "
                                r"than this machine's .*lower eval.max_length or eval.batch_size"):
      validate_config(c, study=True)

  def test_every_study_kind_refuses_and_names_a_bound_that_fits(self):
    for name, c, check in _budget_configs():
      with self.subTest(name):
        with self.assertRaisesRegex(ConfigError, r'eval.max_length=100000000 on .*'
                                    r'\(eval.max_length <= ([0-9,]+) fits\)') as caught:
          check(c)
        bound = int(re.search(r'<= ([0-9,]+) fits', str(caught.exception))[1].replace(',', ''))
        self.assertGreaterEqual(bound, 8)
        c.eval.max_length = bound
        check(c)  # the bound named fits
        c.eval.max_length = 2 * bound
        with self.assertRaises(ConfigError):
          check(c)

  def test_models_evaluated_at_once_multiply_the_memory(self):
    c = copy_config.get_config('scale=cpu')  # 3 seeds stacked, 2 setups side by side
    self.assertEqual(eval_budget.models_at_once(c, stacked_seeds=True), 6)
    self.assertEqual(eval_budget.models_at_once(c, stacked_seeds=False), 2)
    one, six = (eval_budget._decoder_cost(c, c.eval.max_length, n)[0] for n in (1, 6))
    self.assertEqual(six, 6 * one)
    c.eval.max_length = 100_000_000
    bounds = {}
    for models in (1, 6):
      with self.assertRaisesRegex(ConfigError, r'<= ([0-9,]+) fits') as caught:
        eval_budget.check(c, models)
      bounds[models] = int(re.search(r'<= ([0-9,]+) fits', str(caught.exception))[1]
                           .replace(',', ''))
    self.assertLess(bounds[6], bounds[1])
    c.eval.max_length = bounds[1]  # fits one model, not six at once: the message says why
    eval_budget.check(c, 1)
    with self.assertRaisesRegex(ConfigError, r'for each of the 6 models evaluated at once '
                                r'\(study.seeds stacked × study.parallel_setups\).*'
                                r'eval.batch_size, study.parallel_setups'):
      eval_budget.check(c, 6)
    with self.assertRaisesRegex(ConfigError, 'models evaluated at once'):
      validate_config(c, study=True)

  def test_chomsky_validation_refuses_before_training(self):
    c = chomsky_config.get_config('scale=tiny,encodings=rope')  # randomized: refused earlier
    c.eval.max_length = 100_000_000
    with self.assertRaisesRegex(ConfigError, r'eval.max_length=100000000 on 15 tasks'):
      suite_config.validate(c)

  def test_an_evaluation_past_the_work_limit_is_refused(self):
    c = copy_config.get_config('scale=tiny')
    c.eval.num_samples = 10 ** 15
    with self.assertRaisesRegex(ConfigError, 'eval.num_samples=1000000000000000 is about .* '
                                'FLOPs, above the limit of 6e\\+17.*no eval.max_length >= 4 '
                                'fits'):
      eval_budget.check(c)

  def test_generation_and_context_extensions_count_as_evaluations(self):
    c = copy_config.get_config('scale=cpu')  # rope, generation, three RoPE scalings
    _, full, _, _ = eval_budget._decoder_cost(c, c.eval.max_length)
    c.eval.generate, c.eval.rope_scalings = False, ()
    _, forced, _, _ = eval_budget._decoder_cost(c, c.eval.max_length)
    self.assertAlmostEqual(full / forced, 5.0)

  def test_the_presets_fit(self):
    for scale in ('tiny', 'cpu', 'paper'):
      for module in (copy_config, addition_config, seq2seq_config, flipflop_config):
        c = module.get_config(f'scale={scale}')
        models = eval_budget.models_at_once(c, stacked_seeds=c.study.vmap_seeds)
        eval_budget.check(c, models)
      eval_budget.check_encoder(chomsky_config.get_config(f'scale={scale}'))


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
