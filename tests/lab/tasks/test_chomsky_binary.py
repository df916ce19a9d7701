"""binary_addition, binary_multiplication, compute_sqrt against a NumPy /
Python-int transcription of google-deepmind/randomized_positional_encodings
`tasks/cs/{binary_addition,binary_multiplication,compute_sqrt}.py`: the bit
arithmetic at 500 bits, the labels on every input at small lengths and on
drawn inputs at long ones, and the samplers' distributions."""

import collections
import math
import random

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from attention_jax.lab.tasks.chomsky import binary

N = 24  # the max_length of most tests: one compiled shape per function


# --- Their code, transcribed (module-level np.random / random made explicit) ---

def numbers_to_variable_length_binary(numbers, lengths, little_endian=True):
  binary_strings = [f'{num:b}'.zfill(length) for num, length in zip(numbers, lengths)]
  if little_endian:
    binary_strings = [b[::-1] for b in binary_strings]
  return [list(map(int, b)) for b in binary_strings]


def numbers_to_fixed_length_binary(numbers, length, little_endian=True):
  return numbers_to_variable_length_binary(numbers, [length] * len(numbers), little_endian)


def expression_from_numbers(numbers_n, numbers_m):
  return [n + [2] + m for n, m in zip(numbers_n, numbers_m)]


def their_operands(rng, py_rng, batch_size, length, op):
  """`_sample_expressions_and_results` for length > 2 (op: their `sum` / `*`)."""
  length_n = rng.randint(1, length - 1, size=(batch_size,))
  length_m = length - 1 - length_n
  integer_n = [py_rng.randint(1, 2 ** int(len_n) - 1) for len_n in length_n]
  integer_m = [py_rng.randint(1, 2 ** int(len_m) - 1) for len_m in length_m]
  binary_n = numbers_to_variable_length_binary(integer_n, length_n)
  binary_m = numbers_to_variable_length_binary(integer_m, length_m)
  expressions = expression_from_numbers(binary_n, binary_m)
  results = numbers_to_fixed_length_binary([op(a, b) for a, b in zip(integer_n, integer_m)], 0)
  return expressions, results


def their_addition_batch(rng, py_rng, batch_size, length):
  if length <= 2:
    numbers = rng.randint(0, 2**length - 1, size=(batch_size))
    expressions = numbers_to_fixed_length_binary(numbers, length)
    results = numbers_to_fixed_length_binary(numbers, 0)
  else:
    expressions, results = their_operands(rng, py_rng, batch_size, length, lambda a, b: a + b)
  results = [res + [2] + [0] * (length - len(res)) for res in results]
  return expressions, results


def their_multiplication_batch(rng, py_rng, batch_size, length):
  if length <= 2:
    numbers = rng.randint(0, 2**length - 1, size=(batch_size))
    expressions = numbers_to_fixed_length_binary(numbers, length)
    results = [[0] * (length - 1)] * batch_size
  else:
    expressions, results = their_operands(rng, py_rng, batch_size, length, lambda a, b: a * b)
  results = [res + [2] + [0] * (length - 1 - len(res)) for res in results]
  return expressions, results


def their_sqrt_batch(py_rng, batch_size, length):
  numbers = [py_rng.randint(1, 2**length - 1) for _ in range(batch_size)]
  binary_numbers = numbers_to_fixed_length_binary(numbers, length, little_endian=False)
  sqrts = list(map(math.isqrt, numbers))
  return binary_numbers, numbers_to_fixed_length_binary(sqrts, math.ceil(length / 2),
                                                        little_endian=False)


# --- Their labels of one given input (the result computed from the expression) ---

def _little(bits):
  return sum(int(b) << i for i, b in enumerate(bits))


def their_label(name, x):
  """Their output for input `x` (a list of n symbols), as their sample_batch makes it."""
  n = len(x)
  if name == 'compute_sqrt':
    number = int(''.join(map(str, x)), 2)
    return numbers_to_fixed_length_binary([math.isqrt(number)], math.ceil(n / 2), False)[0]
  if n <= 2:
    res = numbers_to_fixed_length_binary([_little(x)], 0)[0] if name == 'binary_addition' \
        else [0] * (n - 1)
  else:
    at = x.index(2)
    a, b = _little(x[:at]), _little(x[at + 1:])
    res = numbers_to_fixed_length_binary([a + b if name == 'binary_addition' else a * b], 0)[0]
  pad = n - len(res) if name == 'binary_addition' else n - 1 - len(res)
  return res + [2] + [0] * pad


def all_inputs(name, n):
  """Every input their sampler can draw at length n."""
  if name == 'compute_sqrt':
    return numbers_to_fixed_length_binary(range(1, 2**n), n, little_endian=False)
  if n <= 2:
    return numbers_to_fixed_length_binary(range(0, 2**n - 1), n)
  out = []
  for len_n in range(1, n - 1):
    len_m = n - 1 - len_n
    for a in range(1, 2**len_n):
      for b in range(1, 2**len_m):
        out += expression_from_numbers(numbers_to_variable_length_binary([a], [len_n]),
                                       numbers_to_variable_length_binary([b], [len_m]))
  return out


# --- Ours, compiled once per shape -------------------------------------------

LABELS = {'binary_addition': binary.label_addition,
          'binary_multiplication': binary.label_multiplication,
          'compute_sqrt': binary.label_sqrt}
_label = jax.jit(lambda name, x, n: LABELS[name](x, n), static_argnums=0)
DRAWS = 4000  # every batch drawn here has this size: one compilation per task
TRACES = collections.Counter()  # traces of each task's generate, to show `n` is traced


def _counted(name):
  def generate_fn(key, n):
    TRACES[name] += 1
    return binary.TASKS[name].generate(key, n, DRAWS, N)
  return jax.jit(generate_fn)


_generate = {name: _counted(name) for name in binary.TASKS}


def ours_label(name, rows, n, width=N, chunk=1024):
  """Our labels of `rows` (lists of n symbols), zero-padded to `[len(rows), width]`;
  run in batches of `chunk` rows so that every call has one shape."""
  x = np.zeros((-(-len(rows) // chunk) * chunk, width), np.int32)
  x[:len(rows), :n] = rows
  y = np.concatenate([np.asarray(_label(name, jnp.asarray(x[i:i + chunk]), jnp.int32(n)))
                      for i in range(0, len(x), chunk)])
  return x[:len(rows)], y[:len(rows)]


def generate(name, n, seed=0):
  """Our `[DRAWS, N]` inputs and `[DRAWS, output_length(N)]` outputs at length n."""
  x, y = _generate[name](jax.random.key(seed), jnp.int32(n))
  return np.asarray(x), np.asarray(y)


def to_bits(values, width):
  return np.array([[(v >> i) & 1 for i in range(width)] for v in values], np.int32)


def from_bits(rows):
  return [_little(r) for r in rows]


def total_variation(samples, probabilities):
  counts = collections.Counter(samples)
  keys = set(counts) | set(probabilities)
  return 0.5 * sum(abs(counts[k] / len(samples) - probabilities.get(k, 0.0)) for k in keys)


def empirical(samples):
  return {k: c / len(samples) for k, c in collections.Counter(samples).items()}


# Sampling tolerances: with K outcomes and S draws, E[TV(empirical, exact)] is about
# 0.5 * K * sqrt(2 p (1 - p) / (pi S)) (p = 1 / K) and its standard deviation a few times
# smaller, so 0.05 at K <= 12, S >= 4000 (expected TV <= 0.023) fails only for a real
# difference of a few percent; the seeds are fixed, so the tests are deterministic.


class ArithmeticTest(absltest.TestCase):
  """The bit-vector primitives against Python integers, past any integer dtype."""

  def setUp(self):
    super().setUp()
    self.rng = random.Random(0)

  def _edge_values(self, width):
    top = 2**width - 1
    return [0, 1, top, top - 1, 2**(width - 1), 2**(width // 2) - 1] + [
        self.rng.getrandbits(self.rng.randint(1, width)) for _ in range(10)]

  def test_add_bits_500(self):
    width = 500
    a = self._edge_values(width)
    b = [1, 1, 1, 2, 2**(width - 1), 2**(width // 2) + 1] + list(reversed(a[6:]))
    total = jax.jit(binary.add_bits)(jnp.asarray(to_bits(a, width)), jnp.asarray(to_bits(b, width)))
    self.assertEqual(from_bits(np.asarray(total)), [(u + v) % 2**width for u, v in zip(a, b)])

  def test_multiply_bits_500(self):
    width = 500
    a = [2**249 - 1, 2**499, 3, 0] + [self.rng.getrandbits(250) for _ in range(4)]
    b = [2**249 + 1, 2, 2**498 - 1, 7] + [self.rng.getrandbits(250) for _ in range(4)]
    product = jax.jit(binary.multiply_bits)(jnp.asarray(to_bits(a, width)),
                                            jnp.asarray(to_bits(b, width)))
    self.assertEqual(from_bits(np.asarray(product)), [(u * v) % 2**width for u, v in zip(a, b)])

  def test_isqrt_bits_500(self):
    pairs = 250
    root = self.rng.getrandbits(250)
    values = [0, 1, 2, 3, 4, 2**500 - 1, root**2, root**2 - 1, (2**250 - 1)**2] + [
        self.rng.getrandbits(self.rng.randint(1, 500)) for _ in range(7)]
    out = jax.jit(binary.isqrt_bits, static_argnums=1)(jnp.asarray(to_bits(values, 2 * pairs)),
                                                       pairs)
    self.assertEqual(from_bits(np.asarray(out)), [math.isqrt(v) for v in values])


class LabelTest(absltest.TestCase):
  """Our labels equal theirs on every input their samplers can draw (small n) and
  on inputs their samplers drew (longer n), with zeros past the output."""

  def _check(self, name, rows, n):
    x, y = ours_label(name, rows, n)
    out = binary.TASKS[name].output_length(n)
    expected = np.zeros((len(rows), y.shape[1]), np.int32)
    expected[:, :out] = [their_label(name, list(r)) for r in rows]
    np.testing.assert_array_equal(y, expected, err_msg=f'{name} n={n}')

  def test_every_input_small_lengths(self):
    for name in LABELS:
      for n in range(1, 9):
        self._check(name, all_inputs(name, n), n)

  def test_drawn_inputs_long_lengths(self):
    rng, py_rng = np.random.RandomState(0), random.Random(0)
    for n in (9, 12, 17, 23, 24):
      for name, sampler in (('binary_addition', their_addition_batch),
                            ('binary_multiplication', their_multiplication_batch)):
        expressions, results = sampler(rng, py_rng, 64, n)
        x, y = ours_label(name, expressions, n)
        np.testing.assert_array_equal(y[:, :len(results[0])], results, err_msg=f'{name} {n}')
        self.assertTrue((y[:, len(results[0]):] == 0).all())
      numbers, roots = their_sqrt_batch(py_rng, 64, n)
      _, y = ours_label('compute_sqrt', numbers, n)
      np.testing.assert_array_equal(y[:, :len(roots[0])], roots, err_msg=f'sqrt {n}')
      self.assertTrue((y[:, len(roots[0]):] == 0).all())

  def test_their_examples(self):
    # Their docstring examples, as their code (not the docstrings) gives them.
    cases = [('binary_addition', '001201101', '0101120000'),  # 4 + 22 = 26
             ('binary_addition', '10012000001', '100101200000'),  # 9 + 32 = 41
             ('binary_multiplication', '001201101', '000110120'),  # 4 * 22 = 88
             ('binary_multiplication', '10012000001', '00000100120'),  # 9 * 32 = 288
             ('binary_multiplication', '010012011', '001101120'),  # 18 * 6 = 108
             ('compute_sqrt', '100101', '110'),  # isqrt(37) = 6
             ('compute_sqrt', '111', '10')]  # isqrt(7) = 2
    for name, x, y in cases:
      rows = [list(map(int, x))]
      self.assertEqual(their_label(name, rows[0]), list(map(int, y)), (name, x))
      _, ours = ours_label(name, rows, len(x))
      self.assertEqual(list(ours[0, :len(y)]), list(map(int, y)), (name, x))

  def test_wrong_labels_are_caught(self):
    # The comparison can fail: a big-endian sum or a missing terminator differs from theirs.
    x = list(map(int, '001201101'))
    good = their_label('binary_addition', x)
    self.assertNotEqual(good, [0, 1, 0, 1, 1, 2, 0, 0, 0, 0][::-1])
    self.assertNotEqual(good, [0, 1, 0, 1, 1, 0, 0, 0, 0, 0])
    _, ours = ours_label('binary_addition', [x], len(x))
    self.assertNotEqual(list(ours[0, :10]), their_label('binary_multiplication', x) + [0])

  def test_terminator_is_the_accuracy_mask_end(self):
    # Their accuracy_mask: positions up to argmax over the target classes, i.e. the first 2.
    for name in ('binary_addition', 'binary_multiplication'):
      self.assertTrue(binary.TASKS[name].terminated)
      for n in (1, 2, 5, 8):
        rows = all_inputs(name, n)
        _, y = ours_label(name, rows, n)
        for row, label in zip(y, rows):
          ends = their_label(name, list(label)).index(2)
          self.assertEqual(int(np.argmax(row)), ends)
    self.assertFalse(binary.TASKS['compute_sqrt'].terminated)


class SamplerTest(absltest.TestCase):
  """Our drawn batches: valid, labelled as theirs, distributed as their samplers'."""

  def test_task_sizes(self):
    sizes = {name: (t.input_size, t.output_size, t.level) for name, t in binary.TASKS.items()}
    self.assertEqual(sizes, {'binary_addition': (3, 3, 'context_sensitive'),
                             'binary_multiplication': (3, 3, 'context_sensitive'),
                             'compute_sqrt': (2, 2, 'context_sensitive')})
    for n in (1, 2, 7, 500):
      self.assertEqual(binary.TASKS['binary_addition'].output_length(n), n + 1)
      self.assertEqual(binary.TASKS['binary_multiplication'].output_length(n), n)
      self.assertEqual(binary.TASKS['compute_sqrt'].output_length(n), math.ceil(n / 2))
      self.assertEqual(binary.TASKS['compute_sqrt'].input_length(n), n)

  def test_batches_valid_and_labelled(self):
    for name, task in binary.TASKS.items():
      for n in (1, 2, 3, 4, 11, 24):
        x, y = generate(name, n, seed=n)
        out = int(task.output_length(n))
        self.assertEqual(x.shape, (DRAWS, N))
        self.assertEqual(y.shape, (DRAWS, int(task.output_length(N))))
        self.assertTrue(((0 <= x) & (x < task.input_size)).all())
        self.assertTrue(((0 <= y) & (y < task.output_size)).all())
        self.assertTrue((x[:, n:] == 0).all() and (y[:, out:] == 0).all(), (name, n))
        possible = {tuple(r) for r in all_inputs(name, n)} if n <= 4 else None
        for row_x, row_y in zip(x[:200], y[:200]):
          row = list(row_x[:n])
          if name != 'compute_sqrt':  # one operator past n = 2, none before
            self.assertEqual(row.count(2), 1 if n > 2 else 0, (name, n, row))
          if possible is not None:  # only inputs their sampler can draw
            self.assertIn(tuple(row), possible, (name, n))
          self.assertEqual(list(row_y[:out]), their_label(name, row), (name, n))

  def test_operand_lengths_and_values(self):
    # n = 6: the first operand's length uniform on 1 … 4, each operand uniform on
    # [1, 2^len - 1] given its length; compared with their sampler's draws.
    n, draws = 6, 2 * DRAWS
    x = np.concatenate([generate('binary_addition', n, seed=s)[0] for s in (1, 11)])
    theirs, _ = their_addition_batch(np.random.RandomState(1), random.Random(1), draws, n)

    def split(rows):
      out = []
      for r in rows:
        at = list(r[:n]).index(2)
        out.append((at, _little(r[:at]), _little(r[at + 1:n])))
      return out

    ours_split, their_split = split(x), split(theirs)
    self.assertLess(total_variation([s[0] for s in ours_split], empirical(
        [s[0] for s in their_split])), 0.05)
    for length in range(1, n - 1):
      exact_a = {v: 1 / (2**length - 1) for v in range(1, 2**length)}
      exact_b = {v: 1 / (2**(n - 1 - length) - 1) for v in range(1, 2**(n - 1 - length))}
      a = [s[1] for s in ours_split if s[0] == length]
      b = [s[2] for s in ours_split if s[0] == length]
      # About 2000 draws per length, <= 15 values: expected TV <= 0.033 (tolerance note).
      self.assertLess(total_variation(a, exact_a), 0.08, length)
      self.assertLess(total_variation(b, exact_b), 0.08, length)
      self.assertLess(total_variation([s[1] for s in their_split if s[0] == length], exact_a),
                      0.08)

  def test_small_lengths_as_theirs(self):
    draws = DRAWS
    for name, sampler in (('binary_addition', their_addition_batch),
                          ('binary_multiplication', their_multiplication_batch)):
      x, y = generate(name, 1, seed=2)
      self.assertTrue((x == 0).all())  # randint(0, 1): always 0
      np.testing.assert_array_equal(y[:, :2], [[0, 2] if name == 'binary_addition' else
                                               [2, 0]] * draws)
      x, _ = generate(name, 2, seed=3)
      theirs, _ = sampler(np.random.RandomState(3), random.Random(3), draws, 2)
      ours_values = [_little(r[:2]) for r in x]
      self.assertEqual(set(ours_values), {0, 1, 2})  # randint(0, 3): never 3
      self.assertLess(total_variation(ours_values, empirical([_little(r) for r in theirs])),
                      0.05)

  def test_sqrt_numbers_uniform(self):
    draws = DRAWS
    for n in (1, 3):
      x, _ = generate('compute_sqrt', n, seed=4 + n)
      ours = [int(''.join(map(str, r[:n])), 2) for r in x]
      theirs, _ = their_sqrt_batch(random.Random(n), draws, n)
      self.assertEqual(set(ours), set(range(1, 2**n)))
      self.assertLess(total_variation(ours, empirical([int(''.join(map(str, r)), 2)
                                                       for r in theirs])), 0.05)

  def test_traced_length_one_compilation(self):
    for n in (1, 2, 3, 7, 24):
      x, y = generate('binary_multiplication', n, seed=20 + n)
      for row_x, row_y in zip(x[:50], y[:50]):
        self.assertEqual(list(row_y[:n]), their_label('binary_multiplication', list(row_x[:n])))
    self.assertEqual(TRACES['binary_multiplication'], 1)  # every length ran one trace


if __name__ == '__main__':
  absltest.main()
