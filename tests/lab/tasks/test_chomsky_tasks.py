"""The 15 tasks against NumPy/Python transcriptions of DeepMind's task code
(google-deepmind/randomized_positional_encodings @ e8c6474, `tasks/`):
outputs on fixed inputs at many lengths (the small special cases included),
and sampling statistics against their samplers."""

import collections
import math
import random

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab import tasks as lab_tasks
from attention_jax.lab.tasks.chomsky import registry
from attention_jax.lab.tasks.chomsky.expressions import evaluate_arithmetic

from tests import tiers

LENGTHS = (1, 2, 3, 4, 5, 8, 13)
BATCH = 48


# --- Their code, transcribed (per example; x a list of ints of length n) ----

def their_even_pairs(x):
  return int(np.sum(np.logical_xor(x[:-1], x[1:])) % 2)


def their_parity(x):
  return int(np.sum(x) % 2)


def their_cycle(x):
  return int(np.sum(np.asarray(x) - 1) % 5)


def their_stack(x):
  n = len(x)
  if n == 1:
    result = list(x)
  else:
    stack_length = next(i for i, t in enumerate(x) if t >= 2)
    current = list(x[:stack_length])
    for action in x[stack_length:]:
      if action == 2:
        if current:
          current.pop()
      elif action in (3, 4):
        current.append(action - 3)
    result = current[::-1]
  result = result + [2]
  return result + [0] * (n + 1 - len(result))


def their_missing_duplicate(x):
  if len(x) == 1:
    return 1
  half = len(x) // 2
  duplicated = list(x[:2 * half])
  gap = duplicated.index(2)
  return duplicated[(gap + half) % (2 * half)]


def _little(bits):
  return sum(int(b) << i for i, b in enumerate(bits))


def _binary(num, length=0, little_endian=True):  # numbers_to_fixed_length_binary
  s = f'{num:b}'.zfill(length)
  return list(map(int, s[::-1] if little_endian else s))


def their_addition(x):
  n = len(x)
  if n <= 2:
    res = _binary(_little(x))
  else:
    at = x.index(2)
    res = _binary(_little(x[:at]) + _little(x[at + 1:]))
  return res + [2] + [0] * (n - len(res))


def their_multiplication(x):
  n = len(x)
  if n <= 2:
    res = [0] * (n - 1)
  else:
    at = x.index(2)
    res = _binary(_little(x[:at]) * _little(x[at + 1:]))
  return res + [2] + [0] * (n - 1 - len(res))


def their_sqrt(x):
  n = len(x)
  num = int(''.join(map(str, x)), 2)
  return _binary(math.isqrt(num), math.ceil(n / 2), little_endian=False)


def their_arithmetic(x):
  """Python's value of the digits/operators (precedence: * first) mod 5."""
  text = ''.join({5: '+', 6: '-', 7: '*'}.get(t, str(t)) for t in x)
  return eval(text) % 5  # pylint: disable=eval-used


BRACKETS = {5: '+', 6: '-', 7: '*', 8: '(', 9: ')'}
EQUATION = {5: '+', 6: '-', 7: '(', 8: ')', 9: 'x', 10: '='}


def _text(x, table):
  return ''.join(table.get(t, str(t)) for t in x)


def their_grammar(modulus, length, mult, rng):
  """`generate_one_expression_and_result` with a NumPy RandomState."""
  if length == 1:
    t = rng.randint(0, modulus)
    return str(t), t
  if length == 2:
    t = rng.randint(0, modulus)
    return '-' + str(t), -t % modulus
  if length == 3:
    t = rng.randint(0, modulus)
    return '(' + str(t) + ')', t
  if length == 4:
    t = rng.randint(0, modulus)
    return '(-' + str(t) + ')', -t % modulus
  left_length = rng.randint(1, length - 3)
  left, lv = their_grammar(modulus, left_length, mult, rng)
  right, rv = their_grammar(modulus, length - left_length - 3, mult, rng)
  op = rng.randint(0, 3 if mult else 2)
  sym, val = [('+', lv + rv), ('-', lv - rv), ('*', lv * rv)][op]
  return '(' + left + sym + right + ')', val % modulus


def their_equation(length, rng):
  expr, val = their_grammar(5, length - 2, False, rng)
  idx = rng.randint(0, len(expr))
  while expr[idx] not in '01234':
    idx = (idx + 1) % (length - 2)
  return expr[:idx] + 'x' + expr[idx + 1:] + '=' + str(val), int(expr[idx]), idx


RULES = {
    'even_pairs': lambda x: [their_even_pairs(x)],
    'parity_check': lambda x: [their_parity(x)],
    'cycle_navigation': lambda x: [their_cycle(x)],
    'stack_manipulation': their_stack,
    'reverse_string': lambda x: list(x[::-1]),
    'duplicate_string': lambda x: list(x) * 2,
    'missing_duplicate_string': lambda x: [their_missing_duplicate(x)],
    'odds_first': lambda x: list(x[1::2]) + list(x[::2]),
    'bucket_sort': lambda x: sorted(x),
    'binary_addition': their_addition,
    'binary_multiplication': their_multiplication,
    'compute_sqrt': their_sqrt,
    'modular_arithmetic': lambda x: [their_arithmetic(x)],
    'modular_arithmetic_brackets': lambda x: [eval(_text(x, BRACKETS)) % 5],  # pylint: disable=eval-used
}


_COMPILED = {}


def _generate(name, n, batch=BATCH, max_length=13, seed=0):
  task = lab_tasks.get_spec(name)
  if (name, batch, max_length) not in _COMPILED:  # one compile per shape: n is traced
    _COMPILED[name, batch, max_length] = jax.jit(
        lambda k, m: task.generate(k, m, batch, max_length))
  fn = _COMPILED[name, batch, max_length]
  x, y = fn(jax.random.key(seed + 1000 * n), jnp.int32(n))
  nx, ny = int(task.input_length(n)), int(task.output_length(n))
  x, y = np.asarray(x), np.asarray(y)
  assert not x[:, nx:].any() and not y[:, ny:].any(), 'zeros past the length'
  assert x.shape[1] == task.input_length(max_length) and y.shape[1] == task.output_length(
      max_length)
  return task, x[:, :nx], y[:, :ny]


class OutputsTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*[(name, name) for name in RULES])
  @tiers.fast_cases(4)  # every other task in the slow tier
  def test_outputs_equal_theirs_at_every_length(self, name):
    for n in LENGTHS:
      task, x, y = _generate(name, n)
      self.assertTrue(((x >= 0) & (x < task.input_size)).all(), (name, n))
      self.assertTrue(((y >= 0) & (y < task.output_size)).all(), (name, n))
      for row in range(BATCH):
        self.assertEqual(list(y[row]), RULES[name](list(x[row])), (name, n, list(x[row])))

  def test_solve_equation_solution_solves_it(self):
    for n in LENGTHS:
      _, x, y = _generate('solve_equation', n)
      for row in range(BATCH):
        if n < 3:  # theirs: zeros and class 0
          self.assertEqual((list(x[row]), int(y[row, 0])), ([0] * n, 0))
          continue
        text = _text(list(x[row]), EQUATION)
        self.assertEqual(text.count('x'), 1, text)
        left, right = text.split('=')
        self.assertEqual(eval(left.replace('x', str(y[row, 0]))) % 5, int(right), text)  # pylint: disable=eval-used

  def test_arithmetic_evaluator_is_theirs_with_precedence(self):
    # Their _evaluate_expression: 1 + 2 * 3 = 2, 1 - 1 - 1 = 4, 0*1 + 4*3 - 2 = 0 (mod 5).
    for text, value in (('1+2*3', 2), ('1-1-1', 4), ('0*1+4*3-2', 0), ('3', 3)):
      ids = jnp.asarray([{'+': 5, '-': 6, '*': 7}.get(c, None) or int(c) for c in text])
      self.assertEqual(int(evaluate_arithmetic(ids)), value, text)

  def test_modular_arithmetic_makes_even_lengths_odd(self):
    task = lab_tasks.get_spec('modular_arithmetic')
    self.assertEqual([task.input_length(n) for n in (1, 2, 3, 4, 40)], [1, 1, 3, 3, 39])

  def test_odds_first_follows_the_code_not_the_docstring(self):
    _, x, y = _generate('odds_first', 8)
    np.testing.assert_array_equal(y[:, :4], x[:, 1::2])  # 0-based odd indices first


def _counts(values):
  c = collections.Counter(values)
  return {k: v / len(values) for k, v in c.items()}


def _total_variation(p, q):
  return 0.5 * sum(abs(p.get(k, 0) - q.get(k, 0)) for k in set(p) | set(q))


class SamplingTest(chex.TestCase):
  """Our samplers against theirs. Sample sizes make the tolerances several
  standard errors wide (TV distance of 2,000 draws over ≤ 40 outcomes: ~0.05)."""

  def test_brackets_strings_distributed_as_theirs(self):
    rng = np.random.RandomState(0)
    for n in (5, 6, 7):
      theirs = _counts([their_grammar(5, n, True, rng)[0] for _ in range(2000)])
      _, x, _ = _generate('modular_arithmetic_brackets', n, batch=2000, max_length=7)
      ours = _counts([_text(list(r), BRACKETS) for r in x])
      self.assertLess(_total_variation(_counts([len(s) for s in ours]), {n: 1.0}), 1e-9)
      # Shapes of the strings (digits blanked), and the operator of the root.
      shape = lambda d: _counts([''.join('d' if c.isdigit() else c for c in s)
                                 for s, w in d.items() for _ in range(int(w * 2000))])
      self.assertLess(_total_variation(shape(ours), shape(theirs)), 0.08, n)

  def test_brackets_root_split_and_labels_as_theirs(self):
    rng = np.random.RandomState(1)
    n = 12
    theirs = [their_grammar(5, n, True, rng) for _ in range(3000)]
    _, x, y = _generate('modular_arithmetic_brackets', n, batch=3000, max_length=12)

    def root_left_length(s):  # the left operand of the outer brackets
      depth = 0
      for i, c in enumerate(s[1:-1]):
        depth += (c == '(') - (c == ')')
        if depth == 0 and c in '+-*' and i > 0 and s[i] not in '(+-*':
          return i
      return None
    ours_split = _counts([root_left_length(_text(list(r), BRACKETS)) for r in x])
    their_split = _counts([root_left_length(s) for s, _ in theirs])
    self.assertLess(_total_variation(ours_split, their_split), 0.06)
    self.assertLess(_total_variation(_counts(list(y[:, 0])), _counts([v for _, v in theirs])),
                    0.06)

  def test_equation_hidden_position_as_theirs(self):
    rng = np.random.RandomState(2)
    n = 9
    their_idx = _counts([their_equation(n, rng)[2] for _ in range(3000)])
    _, x, y = _generate('solve_equation', n, batch=3000, max_length=9)
    our_idx = _counts([list(r).index(9) for r in x])
    self.assertLess(_total_variation(our_idx, their_idx), 0.06)
    self.assertLess(_total_variation(_counts(list(y[:, 0])), {d: 0.2 for d in range(5)}), 0.06)

  def test_stack_length_uniform_below_n(self):
    _, x, _ = _generate('stack_manipulation', 8, batch=4000, max_length=8)
    lengths = _counts([next(i for i, t in enumerate(r) if t >= 2) for r in x])
    self.assertEqual(sorted(lengths), list(range(1, 8)))  # numpy randint(1, n): 1 … n - 1
    self.assertLess(_total_variation(lengths, {k: 1 / 7 for k in range(1, 8)}), 0.05)

  def test_binary_operands_as_theirs(self):
    n = 9
    _, x, _ = _generate('binary_addition', n, batch=4000, max_length=9)
    at = _counts([list(r).index(2) for r in x])  # the first operand's length
    self.assertLess(_total_variation(at, {k: 1 / (n - 2) for k in range(1, n - 1)}), 0.05)
    self.assertTrue(all(_little(r[:list(r).index(2)]) >= 1 for r in x))  # never 0
    # One-bit operands are always 1 (randint(1, 1)); two-bit ones uniform on 1 … 3.
    two = [_little(r[:2]) for r in x if list(r).index(2) == 2]
    self.assertLess(_total_variation(_counts(two), {1: 1 / 3, 2: 1 / 3, 3: 1 / 3}), 0.08)

  def test_binary_small_lengths_as_theirs(self):
    _, x, y = _generate('binary_addition', 1, batch=200)
    self.assertTrue((x == 0).all())  # randint(0, 2**1 - 1): always 0
    np.testing.assert_array_equal(y, np.tile([0, 2], (200, 1)))
    _, x, _ = _generate('binary_addition', 2, batch=3000)
    self.assertLess(_total_variation(_counts([_little(r) for r in x]),
                                     {0: 1 / 3, 1: 1 / 3, 2: 1 / 3}), 0.05)
    _, _, y = _generate('binary_multiplication', 2, batch=10)
    np.testing.assert_array_equal(y, np.tile([0, 2], (10, 1)))

  def test_sqrt_numbers_uniform_and_never_zero(self):
    _, x, _ = _generate('compute_sqrt', 3, batch=4000)
    values = _counts([int(''.join(map(str, r)), 2) for r in x])
    self.assertLess(_total_variation(values, {k: 1 / 7 for k in range(1, 8)}), 0.05)

  def test_missing_duplicate_gap_uniform(self):
    _, x, _ = _generate('missing_duplicate_string', 7, batch=4000, max_length=7)
    self.assertTrue((x[:, 6] == 3).all())  # odd length: the fill token
    gaps = _counts([list(r).index(2) for r in x])
    self.assertLess(_total_variation(gaps, {k: 1 / 6 for k in range(6)}), 0.05)
    _, x, y = _generate('missing_duplicate_string', 1, batch=5)
    np.testing.assert_array_equal(x, 1)
    np.testing.assert_array_equal(y, 1)

  def test_classification_balance(self):
    for name, classes in (('parity_check', 2), ('even_pairs', 2), ('cycle_navigation', 5),
                          ('modular_arithmetic', 5)):
      _, _, y = _generate(name, 13, batch=4000)
      self.assertLess(_total_variation(_counts(list(y[:, 0])),
                                       {c: 1 / classes for c in range(classes)}), 0.05, name)


class DecoderLayoutTest(chex.TestCase):
  """Our causal-decoder protocol: `BOS x SEP y EOS`, inputs and classes apart."""

  def test_decoder_layout(self):
    from attention_jax.lab import tasks  # pylint: disable=g-import-not-at-top
    for name in ('parity_check', 'binary_addition', 'modular_arithmetic'):
      task = tasks.get_task(name)
      spec = lab_tasks.get_spec(name)
      lengths = jnp.array([1, 4, 6], jnp.int32)
      tokens, is_output = jax.jit(task.example, static_argnums=(2, 3))(
          jax.random.key(0), lengths, 0, 6)
      self.assertEqual(tokens.shape[1], task.sequence_length(6))
      for row, n in enumerate([1, 4, 6]):
        t = list(np.asarray(tokens[row]))
        nx, ny = int(spec.input_length(n)), int(spec.output_length(n))
        x = [v - tasks.NUM_SPECIAL for v in t[1:1 + nx]]
        y = [v - tasks.NUM_SPECIAL - spec.input_size for v in t[2 + nx:2 + nx + ny]]
        self.assertEqual(t[0], tasks.BOS)
        self.assertEqual(t[1 + nx], tasks.SEP)
        self.assertEqual(t[2 + nx + ny], tasks.EOS)
        self.assertTrue(all(0 <= v < spec.input_size for v in x), (name, t))
        self.assertEqual(y, RULES[name](x), (name, t))
        np.testing.assert_array_equal(np.flatnonzero(is_output[row]),
                                      np.arange(2 + nx, 3 + nx + ny))

  def test_coupling_refused(self):
    from attention_jax.lab import tasks  # pylint: disable=g-import-not-at-top
    with self.assertRaisesRegex(ValueError, 'not for parity_check'):
      tasks.get_task('parity_check').check_max_position(10, 5)


class LongLengthTest(chex.TestCase):

  def test_binary_tasks_exact_at_length_200(self):
    # Past 64 bits: Python integers check the bit-vector arithmetic.
    for name in ('binary_addition', 'binary_multiplication', 'compute_sqrt'):
      _, x, y = _generate(name, 200, batch=4, max_length=200)
      for row in range(4):
        self.assertEqual(list(y[row]), RULES[name](list(x[row])), name)


if __name__ == '__main__':
  absltest.main()
