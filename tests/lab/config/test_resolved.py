"""A run's config resolved once into a frozen record (`config.resolved`):
its facts equal what the config says, and training and evaluation read
them from the record, never from the config again."""

import dataclasses
import tempfile
from unittest import mock

import chex
import jax
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

from attention_jax.lab.config.resolved import resolve
from attention_jax.lab.config import facts
from attention_jax.lab.runs import plan
from attention_jax.lab import train
from attention_jax.lab.evaluate import hard
from attention_jax.lab.runs import one_run
from attention_jax.lab.runs.timing import Stopwatch
from attention_jax.nn.seq2seq import Seq2Seq
from attention_jax.nn.transformer import TransformerLM
from configs import addition as addition_config
from configs import copy as copy_config

# (name, config builder): a plain, a randomized, a coupled and an Abacus
# transformer, and a seq2seq model.
CONFIGS = (
    ('rope', lambda: copy_config.get_config('scale=tiny,encoding=rope')),
    ('randomized', lambda: copy_config.get_config('scale=tiny,encoding=rope:randomized')),
    ('coupled', lambda: addition_config.get_config('scale=tiny,encoding=rope:coupled')),
    ('abacus', lambda: addition_config.get_config('scale=tiny,encoding=fire:abacus')),
    ('seq2seq', lambda: _seq2seq()),
)


def _seq2seq():
  c = copy_config.get_config('scale=tiny')
  c.model.kind = 'seq2seq_attention'
  return c


def _one_run(config):
  """The study's first run's config (its entry applied, options completed)."""
  return plan.run_configs(config)[0]


class ResolvedRunTest(parameterized.TestCase):

  @parameterized.named_parameters(*CONFIGS)
  def test_record_facts_equal_the_configs(self, make):
    c = _one_run(make())
    run = resolve(c)
    self.assertEqual(run.task, facts.configured_task(c))
    self.assertEqual(run.training_task, facts.training_task(c))
    self.assertEqual(run.evaluation_tasks, tuple(facts.evaluation_tasks(c)))
    self.assertEqual(run.randomized_max_position, facts.randomized_max_position(c))
    self.assertEqual(run.coupled_max_position, facts.coupled_max_position(c))
    self.assertEqual(run.eval_max_position, run.randomized_max_position
                     if c.positions.randomized_eval == 'random' else 0)
    self.assertEqual(list(run.eval_lengths), sorted(run.eval_lengths))
    self.assertEqual(run.config.to_dict(), facts.resolve_options(c).to_dict())
    model = run.build_model(0)
    self.assertIsInstance(model, Seq2Seq if c.model.kind != 'transformer' else TransformerLM)
    # The same seed, the same parameters: the record builds what it says.
    chex.assert_trees_all_equal(nnx.state(model, nnx.Param),
                                nnx.state(run.build_model(0), nnx.Param))

  def test_record_is_frozen_and_resolving_it_again_is_itself(self):
    run = resolve(_one_run(copy_config.get_config('scale=tiny')))
    self.assertIs(resolve(run), run)
    with self.assertRaises(dataclasses.FrozenInstanceError):
      run.task = None  # pytype: disable=annotation-type-mismatch
    with self.assertRaises(TypeError):
      run.model_arguments['d_model'] = 1

  def test_record_does_not_alias_the_config(self):
    c = _one_run(copy_config.get_config('scale=tiny'))
    run = resolve(c)
    c.model.d_model = 2 * c.model.d_model
    self.assertNotEqual(run.config.model.d_model, c.model.d_model)
    self.assertEqual(run.model_arguments['d_model'], run.config.model.d_model)

  def test_training_and_evaluation_read_the_record_not_the_config(self):
    # Every derivation from a config refuses once the record is made: the
    # run trains and is evaluated (lengths, hard set) from its record alone.
    c = copy_config.get_config('scale=tiny,encoding=rope:randomized')
    c.train.update(num_steps=4, log_every=2, checkpoint_every=0, steps_per_call=2)
    c.eval.update(lengths=(2, 5), num_samples=8, batch_size=8)
    run = resolve(_one_run(c))
    derived = ('configured_task', 'training_task', 'evaluation_tasks', 'task_of',
               'randomized_max_position', 'coupled_max_position', 'longest_sequence',
               'model_max_positions', 'abacus_embeddings', 'resolve_options')

    def refused(*_, **__):
      raise AssertionError('derived from the config again, past its record')

    with tempfile.TemporaryDirectory() as workdir, \
        mock.patch.multiple(facts, **{name: refused for name in derived}):
      model, _ = train.train(run, progress=False)
      rows, _ = one_run._evaluate([model], [run], Stopwatch(), [workdir])
      hard_rows = hard.config_rows([model], [run])
    self.assertEqual(sorted({r['length'] for r in rows[0]}), [2, 5])
    self.assertEqual(sorted({r['length'] for r in hard_rows[0]}), [2, 5])


if __name__ == '__main__':
  jax.config.update('jax_platforms', 'cpu')
  absltest.main()
