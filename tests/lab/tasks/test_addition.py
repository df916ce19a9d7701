"""Addition: the layout against transcriptions of the official generators
(Cho et al.'s `AdditionDataset` and coupled ids, McLeish et al.'s bucket
entries and index hints), the arithmetic, the sampling, and the config
checks."""

import dataclasses
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab import tasks
from attention_jax.lab.tasks import addition

ADD = tasks.get_task('addition')
CHARS = {**{addition.DIGIT0 + d: str(d) for d in range(10)}, addition.PLUS: '+',
         tasks.SEP: '='}


def _rows(task, lengths, max_length, seed=0):
  batch = tasks.make_batch(task, jax.random.key(seed), jnp.asarray(lengths, jnp.int32),
                           vocab_size=10, max_input_length=max_length)
  tokens = np.concatenate([batch['inputs'][:, :1], batch['targets']], axis=1)
  return batch, tokens


def _text(row):
  """`a+b=s` of one token row (BOS … EOS), hints as '<h>'."""
  out = []
  for t in row[1:]:
    if t == tasks.EOS:
      break
    out.append(CHARS.get(int(t), f'<{int(t) - addition.HINT0}>'))
  return ''.join(out)


def _numbers(text, reverse_operands=True):
  a, rest = text.split('+')
  b, s = rest.split('=')
  flip = (lambda x: x[::-1]) if reverse_operands else (lambda x: x)
  return int(flip(a)), int(flip(b)), s


def _cho_strings(a, b, padding, reverse_input):
  """Cho et al., src/data/addition.py, `AdditionDataset.__init__` (with
  reverse_output=True), transcribed: the input and label strings."""
  numbers = [a, b]
  result = a + b
  max_len = max(len(str(a)), len(str(b)))
  overflow = max_len + 1
  if padding:
    _inputs = [f"{'P' * (max_len - len(str(c)))}{c}" for c in numbers]
    _labels = f"{'P' * (overflow - len(str(result)))}{result}"
  else:
    _inputs = list(map(str, numbers))
    _labels = str(result)
  if reverse_input:
    _inputs = [x[::-1] for x in _inputs]
  _labels = _labels[::-1]
  return '+'.join(_inputs).replace('P', '0'), _labels.replace('P', '0')


def _cho_positions(inputs, labels, reverse_input, start=1):
  """Cho et al., `AdditionDatasetWithCoupledPositions.__getitem__`
  (randomize=False, reverse_output=True), transcribed."""
  a, b = inputs.split('+')
  plus_position = start
  a_positions = list(range(start + 1, start + 1 + len(a)))
  b_positions = list(range(start + 1, start + 1 + len(b)))
  if not reverse_input:
    a_positions = a_positions[::-1]
    b_positions = b_positions[::-1]
  input_positions = a_positions + [plus_position] + b_positions
  ans_positions = list(range(start + 1, start + 1 + len(labels)))
  eq_position = start
  return input_positions, [eq_position] + ans_positions


def _mcleish_entry(a, b, chars=None):
  """McLeish et al., create_data_split.py, `bucket_method_gen` with
  --reverse_all (and `hints_helper` for index hints), transcribed."""
  num1_str, num2_str, result = str(a)[::-1], str(b)[::-1], str(a + b)[::-1]
  if chars is not None:
    hint = lambda s: ''.join(f'{c}{d}' for c, d in zip(chars, s))
    result, num1_str, num2_str = hint(result), hint(num1_str), hint(num2_str)
  return f'{num1_str}+{num2_str}={result}'


class AdditionTest(chex.TestCase, parameterized.TestCase):

  def test_addition_every_sum_is_right_and_scored(self):
    batch, tokens = _rows(ADD, ADD.sample_lengths(jax.random.key(1), 256, 1, 7), 7)
    for row, mask, (la, lb) in zip(tokens, np.asarray(batch['loss_mask']),
                                   np.asarray(batch['lengths'])):
      text = _text(row)
      a_text, rest = text.split('+')
      self.assertEqual((len(a_text), len(rest.split('=')[0])), (la, lb))
      a, b, s = _numbers(text)
      self.assertEqual(s, str(a + b)[::-1])
      for digits in (a_text, rest.split('=')[0]):  # no leading zero past one digit
        self.assertTrue(len(digits) == 1 or digits[-1] != '0')
      equals = 1 + la + 1 + lb  # slot of '='
      # The loss covers exactly s and EOS (as targets, shifted by one).
      np.testing.assert_array_equal(np.flatnonzero(mask), np.arange(equals, equals + len(s) + 1))

  def test_addition_carry_mix_draws_nines_in_training_only(self):
    lengths = ADD.sample_lengths(jax.random.key(1), 512, 1, 7)
    plain = tasks.make_batch(ADD, jax.random.key(3), lengths, vocab_size=10, max_input_length=7)
    # carry_mix 0 is the uniform draw itself, bit for bit (older runs' stream).
    chex.assert_trees_all_equal(plain, tasks.make_batch(
        ADD.for_training(dict(carry_mix=0.0)), jax.random.key(3), lengths, vocab_size=10,
        max_input_length=7))
    nines = {}
    for mix in (0.0, 0.5, 1.0):
      task = ADD.for_training(dict(carry_mix=mix))
      batch, tokens = _rows(task, lengths, 7, seed=3)
      digits, heavy = [], 0
      for row in tokens:
        a, b, s = _numbers(_text(row))
        self.assertEqual(s, str(a + b)[::-1])  # still right sums, no leading zero
        operands = _text(row).split('=')[0].split('+')
        self.assertTrue(all(len(x) == 1 or x[-1] != '0' for x in operands))
        digits += list(''.join(operands))
      nines[mix] = digits.count('9') / len(digits)
    # A digit is 9 with probability 1/10 uniform (about 1/9 as a leading
    # digit), 1/2 + 1/2 · 1/10 = 0.55 carry-heavy.
    self.assertBetween(nines[0.0], 0.08, 0.13)
    self.assertBetween(nines[1.0], 0.50, 0.60)
    self.assertBetween(nines[0.5], 0.28, 0.38)

  def test_addition_carry_mix_is_trained_never_evaluated(self):
    from attention_jax.lab.config import facts  # pylint: disable=import-outside-toplevel
    c = _config('scale=tiny,encoding=windowed_rope:coupled:carry')
    from attention_jax.lab.runs import plan  # pylint: disable=import-outside-toplevel
    (run,) = plan.run_configs(c)
    self.assertEqual(facts.training_task(run).carry_mix, 0.25)
    self.assertEqual([t.carry_mix for t in facts.evaluation_tasks(run)], [0.0])
    self.assertEqual(facts.configured_task(run).carry_mix, 0.0)

  def test_addition_matches_mcleish_bucket_entries(self):
    _, tokens = _rows(ADD, ADD.sample_lengths(jax.random.key(2), 64, 1, 9), 9)
    for row in tokens:
      a, b, _ = _numbers(_text(row))
      self.assertEqual(_text(row), _mcleish_entry(a, b))

  @parameterized.product(padding=(True, False), reverse_input=(True, False))
  def test_addition_matches_cho_strings_and_coupled_ids(self, padding, reverse_input):
    task = dataclasses.replace(ADD, pad_zeros=padding, reverse_operands=reverse_input,
                               coupled_max_position=20)
    batch, tokens = _rows(task, task.sample_lengths(jax.random.key(3), 64, 1, 6), 6)
    positions = np.asarray(batch['positions'])
    for row, ids in zip(tokens, positions):
      text = _text(row)
      a, b, _ = _numbers(text, reverse_input)
      inputs, labels = _cho_strings(a, b, padding, reverse_input)
      self.assertEqual(text, f'{inputs}={labels}')
      input_ids, label_ids = _cho_positions(inputs, labels, reverse_input)
      # BOS at 0; '=' and the answer (labels) after the input; EOS at 0 (dropped: inputs).
      expected = [0] + input_ids + label_ids
      np.testing.assert_array_equal(ids[:len(expected)], expected)
      np.testing.assert_array_equal(ids[len(expected):], 0)

  def test_addition_index_hints_as_mcleish(self):
    task = dataclasses.replace(ADD, index_hints=True, num_hints=12)
    _, tokens = _rows(task, task.sample_lengths(jax.random.key(4), 128, 1, 5), 5)
    starts = set()
    for row in tokens:
      text = _text(row)
      hints = [int(h) for h in re.findall(r'<(\d+)>', text)]
      digits = re.sub(r'<\d+>', '', text)
      a, b, _ = _numbers(digits)
      first = hints[0]
      starts.add(first)
      chars = [(first + i) % 12 for i in range(12)]  # consecutive, cyclic
      expected = _mcleish_entry(a, b, [f'<{c}>' for c in chars])
      self.assertEqual(text, expected)
    self.assertEqual(starts, set(range(12)))  # every start drawn

  def test_addition_lengths_are_independent_and_uniform(self):
    lengths = np.asarray(ADD.sample_lengths(jax.random.key(5), 20_000, 1, 4))
    pairs = np.zeros((4, 4))
    np.add.at(pairs, (lengths[:, 0] - 1, lengths[:, 1] - 1), 1)
    expected = 20_000 / 16
    # Every (la, lb) pair near 1/16 (binomial sd ~ 34): independence and uniformity.
    self.assertLess(np.max(np.abs(pairs - expected)), 5 * np.sqrt(expected))

  def test_addition_one_digit_operands_include_zero(self):
    _, tokens = _rows(ADD, jnp.ones((512, 2), jnp.int32), 3)
    operands = {int(_text(row)[0]) for row in tokens}
    self.assertEqual(operands, set(range(10)))

  def test_addition_same_key_same_batch_and_scalar_lengths(self):
    a, _ = _rows(ADD, jnp.full((8,), 5), 6, seed=7)
    b, _ = _rows(ADD, jnp.full((8, 2), 5), 6, seed=7)
    chex.assert_trees_all_equal({k: v for k, v in a.items() if k != 'lengths'},
                                {k: v for k, v in b.items() if k != 'lengths'})

  def test_addition_sequence_length_fits_the_longest(self):
    for task in (ADD, dataclasses.replace(ADD, index_hints=True)):
      _, tokens = _rows(task, jnp.full((64, 2), 6), 6)
      longest = max(int(np.flatnonzero(row == tasks.EOS)[0]) for row in tokens) + 1
      self.assertLessEqual(longest, task.sequence_length(6))
      self.assertEqual(tokens.shape[1], task.sequence_length(6))


if __name__ == '__main__':
  absltest.main()


def _config(arg='scale=tiny', **fields):
  from configs import addition as addition_config  # pylint: disable=import-outside-toplevel
  c = addition_config.get_config(arg)
  for key, value in fields.items():
    section, name = key.split('__')
    c[section][name] = value
  return c


class AdditionConfigTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('abacus_on_copy', 'scale=tiny,encoding=none:abacus', dict(task__name='copy',
                                                            task__vocab_size=16, eval__grid=()),
       "Abacus embeddings .* task 'copy' has none"),
      ('abacus_with_hints', 'scale=tiny,encoding=fire:abacus:hints', {},
       'index hints .* every digit would be 1'),
      ('hints_with_coupling', 'scale=tiny,encoding=rope:coupled:hints', {},
       'index hints .* and coupled positions do not combine'),
      ('too_few_hints', 'scale=tiny,encoding=fire:hints', dict(task__num_hints=3),
       r'task.num_hints=3 is below the 7 digits'),
      ('abacus_table', 'scale=tiny,encoding=none:abacus', dict(model__abacus_embeddings=5),
       r'model.abacus_embeddings=5 is too small: .* set it >= '),
      ('grid_on_copy', 'scale=tiny', dict(task__name='copy', task__vocab_size=16),
       r'eval.grid=\(1, 6\) is a grid of two operand lengths'),
      ('grid_past_max', 'scale=tiny', dict(eval__grid=(1, 7)),
       r'eval.grid contains 7; each must be an integer in 1 … eval.max_length=6'),
      ('seq2seq', 'scale=tiny', dict(model__kind='seq2seq'),
       "model kind 'seq2seq' reads the seq2seq layout, which task 'addition' does not have"),
      ('decimal', 'scale=tiny', dict(task__vocab_size=16),
       r'task.vocab_size=16: addition.s symbols are the 10 decimal digits'),
      ('bad_option', 'scale=tiny', dict(task__num_hints=0), r'task.num_hints=0 must be an integer >= 1'),
      ('carry_mix_above_one', 'scale=tiny', dict(task__carry_mix=1.5),
       r'task.carry_mix=1.5 must be a number in \[0, 1\]'),
      ('carry_mix_negative', 'scale=tiny', dict(task__carry_mix=-0.1),
       r'task.carry_mix=-0.1 must be a number in \[0, 1\]'),
  )
  def test_addition_config_refusals(self, arg, fields, message):
    from attention_jax.lab.config import validate  # pylint: disable=import-outside-toplevel
    with self.assertRaisesRegex(validate.ConfigError, message):
      validate.validate_config(_config(arg, **fields))

  @parameterized.parameters('none', 'rope:coupled', 'fire:hints', 'fire:randomized',
                            'none:abacus', 'fire:abacus', 'windowed_rope:coupled',
                            'windowed_rope:coupled:carry')
  def test_addition_entries_are_valid(self, entry):
    from attention_jax.lab.config import validate  # pylint: disable=import-outside-toplevel
    validate.validate_config(_config(f'scale=tiny,encoding={entry}'))
