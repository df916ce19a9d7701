"""Inputs given by hand are the task's inputs or a ValueError naming what is
wrong (`tasks.input_forms`, `encode`): a table of bad inputs for every task
with structure, a table of bad operands for addition, and every input each
task's own generator draws accepted (so no rule refuses a real input)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab import tasks
from attention_jax.lab.tasks import input_forms

from tests import tiers

# (task, bad input symbols, what the message must say)
BAD_INPUTS = (
    ('binary_addition', [1, 2, 2, 1], 'exactly one operator .*found 2'),
    ('binary_addition', [2, 1, 1], 'operand a .* is empty'),
    ('binary_addition', [1, 1, 2], 'operand b .* is empty'),
    ('binary_addition', [1, 1, 0, 1], 'exactly one operator .*found 0'),
    ('binary_addition', [2], 'one number .*position 0 holds the operator'),
    ('binary_multiplication', [1, 0, 2], "operand b \\(after '\\*'\\) is empty"),
    ('modular_arithmetic', [1, 5, 6], 'position 2 \\(operand 2\\) holds symbol 6, not a digit'),
    ('modular_arithmetic', [1, 3, 2], 'position 1 holds symbol 3, not an operator'),
    ('modular_arithmetic', [8], 'position 0 \\(operand 1\\) holds symbol 8'),
    ('modular_arithmetic_brackets', [8, 1, 5, 9], 'from position 3'),
    ('modular_arithmetic_brackets', [8, 8, 1, 9, 9], 'from position 4'),
    ('modular_arithmetic_brackets', [1, 5, 2], 'from position 1'),
    ('modular_arithmetic_brackets', [6, 8, 1, 9], 'from position 0'),
    ('solve_equation', [7, 9, 5, 9, 8, 10, 1], '2 unknowns'),
    ('solve_equation', [7, 1, 5, 2, 8, 10, 1], '0 unknowns'),
    ('solve_equation', [9, 1, 3], "ends with '='"),
    ('solve_equation', [9, 10, 7], 'ends with'),
    ('solve_equation', [8, 9, 5, 1, 7, 10, 2], 'from position 0'),
    ('solve_equation', [1, 2], 'all 0'),
    ('stack_manipulation', [3, 0, 2], 'the stack .* is empty'),
    ('stack_manipulation', [1, 2, 0], 'position 2 holds stack bit 0 after the first action'),
    ('missing_duplicate_string', [0, 1, 0, 1], 'exactly one symbol is hidden .*found 0'),
    ('missing_duplicate_string', [2, 1, 2, 1], 'found 2'),
    ('missing_duplicate_string', [0, 1, 2, 0], 'the two copies differ at positions 1 and 3'),
    ('missing_duplicate_string', [0, 2, 3, 0, 1], 'fill symbol 3 ends an odd-length input'),
    ('missing_duplicate_string', [0, 2, 0, 1, 1], 'found it at no position'),
    ('missing_duplicate_string', [0], 'is \\[1\\]'),
)

# Operands `Addition.encode` refuses, each named (`a=` or `b=`).
BAD_OPERANDS = ((1.5, 2, 'a'), (-1, 2, 'a'), (True, 1, 'a'), ('12', 3, 'a'),
                (None, 3, 'a'), (np.int32(4), [1], 'b'), (3, '', 'b'), (3, -7, 'b'),
                (3, np.array([1, 2]), 'b'), (3, 1e3, 'b'), (3, False, 'b'))


class BadInputTest(parameterized.TestCase):

  @parameterized.parameters(*BAD_INPUTS)
  def test_a_malformed_input_is_refused_naming_the_place(self, task, x, message):
    with self.assertRaisesRegex(ValueError, f'{re.escape(f"{task} input {x}:")} .*{message}'):
      tasks.get_task(task).encode(x, vocab_size=10)

  def test_every_task_with_structure_has_bad_inputs_in_the_table(self):
    self.assertEqual({t for t, _, _ in BAD_INPUTS}, set(input_forms.RULES))

  @parameterized.parameters(*BAD_OPERANDS)
  def test_a_bad_addition_operand_is_refused_naming_it(self, a, b, name):
    with self.assertRaisesRegex(ValueError, f'addition: {name}=.* must be an integer >= 0'):
      tasks.get_task('addition').encode(a, b)


class GeneratedInputsPassTest(parameterized.TestCase):

  @parameterized.parameters(*sorted(tasks.SPECS))
  @tiers.fast_cases(4)  # every other task in the slow tier
  def test_every_drawn_input_is_accepted(self, name):
    spec = tasks.get_spec(name).with_alphabet(8)
    lengths = jnp.asarray(np.repeat(np.arange(1, 13), 12), jnp.int32)
    x, _ = spec.sample_examples(jax.random.key(0), lengths, 12)
    x = np.asarray(x)
    for row, n in zip(x, np.asarray(lengths)):
      symbols = [int(s) for s in row[:int(spec.input_length(int(n)))]]
      input_forms.check_input(name, symbols)  # raises on a refused draw
    if name in input_forms.RULES:  # and the whole path, once
      tokens, _, _ = tasks.get_task(name).encode(symbols, vocab_size=8)
      self.assertEqual(int(tokens[0, 0]), tasks.BOS)


if __name__ == '__main__':
  absltest.main()
