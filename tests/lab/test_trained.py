"""The public way to use a run (`lab.trained`): a prediction from raw
inputs is the run's own evaluation on that example (its layout, coupled ids
and greedy decoding), a decoded answer is the task's, and bad inputs, study
workdirs and a coupled model without positions are refused.

Untrained models (parameters from a seed) suffice: the test is that
`predict` decodes exactly what the evaluation decodes, whatever the model.
Loading a trained run from disk: tests/lab/report/test_tools.py (slow tier).
"""

import os
import tempfile

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab.config import facts
from attention_jax.lab.protocols import decoder
from attention_jax.lab import tasks
from attention_jax.lab import trained
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.config.resolved import resolve
from configs import addition as addition_config
from configs import copy as copy_config


def _run(config) -> trained.Trained:
  config = facts.resolve_options(config)
  return trained.Trained(model=resolve(config).build_model(0), config=config,
                         task=facts.configured_task(config), run_dir='untrained')


def _drawn(run, key, lengths):
  """One evaluation example as the study draws it (`tasks.make_batch`)."""
  c = run.config
  return tasks.make_batch(run.task, key, jnp.asarray(lengths, jnp.int32),
                          vocab_size=c.task.vocab_size,
                          max_input_length=int(np.max(lengths)))


class PredictIsTheEvaluationTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('copy_coupled', 'copy', 'windowed_rope:coupled'),
      ('reverse_coupled', 'reverse', 'rope:coupled'), ('parity_check', 'parity_check', 'rope'))
  def test_sequence_task(self, task, encoding):
    run = _run(copy_config.get_config(f'scale=tiny,encoding={encoding},task={task}'))
    batch = _drawn(run, jax.random.key(3), [4])
    n = int(batch['lengths'][0])
    x = [int(t) - tasks.NUM_SPECIAL for t in batch['inputs'][0, 1:1 + n]]
    mine = run.batch(x)
    self._assert_same_decoding(run, mine, batch)
    mask = np.asarray(batch['loss_mask'][0])
    truth = [int(t) for t in np.asarray(batch['targets'][0])[mask]][:-1]  # without EOS
    self.assertEqual(run.task.decode(truth, vocab_size=run.config.task.vocab_size),
                     x if task == 'copy' else x[::-1] if task == 'reverse' else
                     [sum(x) % 2])

  @parameterized.named_parameters(
      ('coupled', 'rope:coupled', [3, 2]), ('coupled_short_first', 'rope:coupled', [1, 4]),
      ('abacus', 'fire:abacus', [2, 3]), ('hints', 'fire:hints', [3, 3]))
  def test_addition(self, encoding, lengths):
    run = _run(addition_config.get_config(f'scale=tiny,encoding={encoding}'))
    key = jax.random.key(sum(lengths))
    batch = _drawn(run, key, [lengths])
    a, b = self._operands(run, batch)
    self._assert_same_decoding(run, run.batch(a, b, key=key), batch, key)
    mask = np.asarray(batch['loss_mask'][0])
    truth = [int(t) for t in np.asarray(batch['targets'][0])[mask]][:-1]
    self.assertEqual(run.task.decode(truth), a + b)

  def _operands(self, run, batch):
    """a and b of a drawn addition example, read back from its tokens."""
    tokens = [int(t) for t in batch['inputs'][0]]
    plus = tokens.index(tasks.NUM_SPECIAL + 10)
    sep = tokens.index(tasks.SEP)
    w = run.task.width
    digits = lambda part: ''.join(str(t - tasks.NUM_SPECIAL) for t in part[w - 1::w])
    a, b = digits(tokens[1:plus]), digits(tokens[plus + 1:sep])
    return int(a[::-1]), int(b[::-1])  # written least significant first

  def _assert_same_decoding(self, run, mine, batch, key=None):
    """The prompt, its positions and the greedy answer equal the
    evaluation's on every slot the drawn example scores."""
    prompt = int(np.argmax(np.asarray(batch['loss_mask'][0]))) + 1
    np.testing.assert_array_equal(mine['inputs'][0, :prompt], batch['inputs'][0, :prompt])
    scored = np.asarray(batch['loss_mask'][0])
    self.assertTrue(np.all(np.asarray(mine['loss_mask'][0])[scored]))
    if 'positions' in batch:  # coupled ids on every slot read while decoding the answer
      last = np.flatnonzero(scored)[-1]
      np.testing.assert_array_equal(mine['positions'][0, :last + 1],
                                    batch['positions'][0, :last + 1])
    ours = np.asarray(decoder.generate_batch(run.model, mine))[0]
    theirs = np.asarray(decoder.generate_batch(run.model, batch))[0]
    np.testing.assert_array_equal(ours[scored], theirs[scored])
    prediction = run.predict(*self._raw(run, batch), key=key)
    written = [int(t) for t in ours[np.asarray(mine['loss_mask'][0])]]
    end = written.index(tasks.EOS) if tasks.EOS in written else len(written)
    self.assertEqual(prediction.tokens, written[:end])
    self.assertEqual(prediction.finished, end < len(written))

  def _raw(self, run, batch):
    if run.task.name == 'addition':
      return self._operands(run, batch)
    n = int(batch['lengths'][0])
    return ([int(t) - tasks.NUM_SPECIAL for t in batch['inputs'][0, 1:1 + n]],)


class RefusalTest(chex.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.copy = _run(copy_config.get_config('scale=tiny,encoding=rope:coupled'))
    cls.addition = _run(addition_config.get_config('scale=tiny,encoding=none'))

  def test_bad_inputs_are_named(self):
    for bad, message in (([], 'expected a non-empty sequence of integers in \\[0, 16\\)'),
                         ([16], '16 is not a symbol'), ([1.0], '1.0 is not a symbol'),
                         ('abc', 'expected a non-empty sequence'),
                         ([True], 'True is not a symbol')):
      with self.assertRaisesRegex(ValueError, f'copy input: {message}'):
        self.copy.predict(bad)
    for a, b in ((1.5, 2), (-1, 2), (True, 1), ('12', 3)):
      with self.assertRaisesRegex(ValueError, r'addition: a=.* must be an integer >= 0'):
        self.addition.predict(a, b)
    # As many raw inputs as the task's encode takes, whatever the task.
    with self.assertRaisesRegex(ValueError, r"predict takes 2 inputs for task 'addition' "
                                r'\(a, b\), got 1: predict\(a, b\)\.'):
      self.addition.predict(12)
    with self.assertRaisesRegex(ValueError, r"predict takes 1 input for task 'copy' "
                                r'\(inputs\), got 3: predict\(\[3, 1, 4\]\)\.'):
      self.copy.predict(3, 1, 4)

  def test_coupled_run_without_positions_is_refused(self):
    with self.assertRaisesRegex(ValueError, 'trained on coupled position ids .* pass '
                                'positions='):
      self.copy.generate(jnp.ones((1, 5), jnp.int32), jnp.array([2]))

  def test_load_names_what_is_there(self):
    empty = tempfile.mkdtemp()
    with self.assertRaisesRegex(ConfigError, 'no such folder'):
      trained.load(os.path.join(empty, 'missing'))
    with self.assertRaisesRegex(ConfigError, 'holds no readable config.json'):
      trained.load(empty)


if __name__ == '__main__':
  absltest.main()
