"""A task of its own layout, written outside the package: one class with
`tasks.protocol.Task`'s members and one `register_task` call, and the whole
study (validation, training, evaluation by teacher forcing and by
generation, the outputs, a loaded run's `predict`) runs it, never asking
which task it is."""

import csv
import dataclasses
import os
import tempfile

import jax
import jax.numpy as jnp
from absl.testing import absltest
import pytest

from attention_jax.lab import tasks
from attention_jax.lab import trained
from attention_jax.lab.config.validate import validate_config
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.runs.study import run_study
from configs import copy as copy_config


@dataclasses.dataclass(frozen=True)
class FirstSymbol:
  """Reads n symbols and writes the first: `BOS x1 … xn SEP x1 EOS`."""
  name: str = 'first_symbol_scratch'
  pack: int = 1
  pack_segments: int = 0
  coupled_max_position: int = 0
  abacus_max_k: int = 0
  digit_tokens: tuple = ()
  has_seq2seq: bool = False
  ceiling: bool = False
  hard_set: str = ''

  def configure(self, task_config):
    del task_config  # no options of its own
    return self

  def for_training(self, task_config):
    del task_config
    return self

  def num_symbols(self, vocab_size):
    return vocab_size

  def sequence_length(self, max_length):
    return max_length + 4  # BOS, the input, SEP, the answer, EOS

  def max_number_length(self, max_length):
    return max_length

  def fixed_lengths(self, n, batch_size):
    return jnp.full((batch_size,), n, jnp.int32)

  def sample_lengths(self, key, batch_size, min_length, max_length):
    return jax.random.randint(key, (batch_size,), min_length, max_length + 1)

  def _layout(self, x, lengths, max_length):
    """Tokens and output slots `[B, T]` of input symbols x `[B, T]`
    (the first `lengths` of each row read)."""
    p = jnp.arange(self.sequence_length(max_length))[None]
    n = lengths[:, None]
    tokens = jnp.select([p == 0, p <= n, p == n + 1, p == n + 2, p == n + 3],
                        [tasks.BOS, x, tasks.SEP, x[:, 1:2], tasks.EOS], tasks.PAD)
    return tokens.astype(jnp.int32), (p >= n + 2) & (p <= n + 3)

  def example(self, key, lengths, vocab_size, max_length):
    shape = (lengths.shape[0], self.sequence_length(max_length))
    x = tasks.NUM_SPECIAL + jax.random.randint(key, shape, 0, vocab_size)
    return self._layout(x, lengths, max_length)

  def encode(self, symbols, vocab_size, key=None):
    del key
    if not symbols or not all(0 <= s < vocab_size for s in symbols):
      raise ValueError(f'{self.name}: symbols are integers in [0, {vocab_size}).')
    n = len(symbols)
    x = jnp.asarray([[0] + [tasks.NUM_SPECIAL + s for s in symbols] + [0] * 3], jnp.int32)
    tokens, is_output = self._layout(x, jnp.array([n]), n)
    return tokens, is_output, jnp.array([n], jnp.int32)

  def decode(self, output_tokens, vocab_size):
    symbols = [int(t) - tasks.NUM_SPECIAL for t in output_tokens]
    return symbols[0] if len(symbols) == 1 and 0 <= symbols[0] < vocab_size else None

  def coupled_positions(self, tokens, lengths, offset):
    raise ValueError(f'{self.name} has no coupled positions.')

  def random_offsets(self, key, lengths, max_position):
    raise ValueError(f'{self.name} has no coupled positions.')

  def check_max_position(self, max_position, max_length):
    raise ValueError(f'{self.name} has no coupled positions.')

  def hard_cases(self, n, vocab_size):
    return []

  def with_inputs(self, inputs, vocab_size, max_length):
    raise ValueError(f'{self.name} has no hard set.')


def _registered(test):
  task = FirstSymbol()
  tasks.register_task(task)
  test.addCleanup(tasks.TASKS.pop, task.name)
  return task


def _config():
  c = copy_config.get_config('scale=tiny')
  c.study.tasks = (FirstSymbol.name,)
  c.study.encodings = ('rope',)
  return c


class ScratchTaskTest(absltest.TestCase):

  def test_scratch_task_registers_and_validates(self):
    task = _registered(self)
    self.assertIsInstance(task, tasks.Task)
    self.assertIs(tasks.get_task(task.name), task)
    (run,) = validate_config(_config(), study=True)
    self.assertEqual(run.longest_sequence, _config().eval.max_length + 3)
    with self.assertRaisesRegex(ValueError, 'is registered already'):
      tasks.register_task(task)
    # Its own refusals read as the task's: coupled ids, the seq2seq layout.
    c = _config()
    c.study.encodings = ('rope:coupled',)
    with self.assertRaisesRegex(ConfigError, rf"task '{task.name}': {task.name} has no "
                                'coupled positions'):
      validate_config(c, study=True)
    c = _config()
    c.study.models = ('seq2seq',)
    with self.assertRaisesRegex(ConfigError, rf"task '{task.name}' does not have"):
      validate_config(c, study=True)

  def test_scratch_task_anything_else_is_refused_naming_what_it_lacks(self):
    @dataclasses.dataclass(frozen=True)
    class Partial:
      name: str = 'partial_scratch'
      pack: int = 1
    with self.assertRaisesRegex(ValueError, r'neither \(it lacks abacus_max_k, ceiling, '
                                r'check_max_position, .*with_inputs\)'):
      tasks.register_task(Partial())

  @pytest.mark.slow
  def test_scratch_task_runs_through_the_study(self):
    task = _registered(self)
    workdir = tempfile.mkdtemp()
    run_study(_config(), workdir, log=lambda _: None)
    with open(os.path.join(workdir, 'results.csv')) as f:
      rows = list(csv.DictReader(f))
    self.assertEqual({r['task'] for r in rows}, {task.name})
    (run,) = validate_config(_config(), study=True)
    self.assertEqual(sorted(int(r['length']) for r in rows), list(run.eval_lengths))
    self.assertTrue(all(r['generated_exact_match'] != '' for r in rows), rows)
    for name in ('summary.md', 'extrapolation.png'):
      self.assertGreater(os.path.getsize(os.path.join(workdir, name)), 0, name)
    loaded = trained.load(os.path.join(workdir, task.name, 'rope', 'seed0'))
    answer = loaded.predict([3, 1, 2])
    self.assertTrue(answer.output is None or 0 <= answer.output < 16, answer)
    self.assertLessEqual(len(answer.tokens), 1)


if __name__ == '__main__':
  absltest.main()
