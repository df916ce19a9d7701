"""The regular tasks (`chomsky/regular.py`) and the string tasks
(`chomsky/strings.py`) against NumPy transcriptions of DeepMind's code
(google-deepmind/randomized_positional_encodings, `tasks/regular/{even_pairs,
parity_check,cycle_navigation}.py`, `tasks/dcf/{reverse_string,
stack_manipulation}.py`, `tasks/cs/{duplicate_string,odds_first,bucket_sort,
missing_duplicate_string}.py`, options from `experiments/constants.py`).

Each transcription is split where their `sample_batch` is: the random draws
(`draw`), then the deterministic rest (`build`), which also runs on every
possible draw at small lengths (`every`). Classes are ints, not one-hot.
"""

import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab.tasks.chomsky import regular
from attention_jax.lab.tasks.chomsky import strings

TASKS = {**regular.TASKS, **strings.TASKS}
VOCAB = {'even_pairs': 2, 'parity_check': 2, 'cycle_navigation': 3, 'reverse_string': 2,
         'duplicate_string': 2, 'odds_first': 2, 'bucket_sort': 5}  # experiments/constants.py


# --- Their code, transcribed ---------------------------------------------------------------

def _uniform_draw(vocab):
  return lambda rs, batch_size, length: rs.randint(0, vocab, size=(batch_size, length))


def _uniform_every(vocab):
  return lambda length: np.array(list(itertools.product(range(vocab), repeat=length)))


# Their `sample_batch` after `strings = jrandom.randint(...)`: the outputs, on ints
# (their one-hot encoding dropped; a class as `[B, 1]`).
THEIR_OUTPUTS = {
    'even_pairs': lambda s: np.sum(np.logical_xor(s[:, :-1], s[:, 1:]), axis=-1)[:, None] % 2,
    'parity_check': lambda s: np.sum(s, axis=1)[:, None] % 2,
    'cycle_navigation': lambda actions: np.sum(actions - 1, axis=1)[:, None] % 5,
    'reverse_string': lambda s: np.flip(s, axis=1),
    'duplicate_string': lambda s: np.concatenate([s] * 2, axis=1),
    'odds_first': lambda s: np.concatenate([s[:, 1::2], s[:, ::2]], axis=1),
    'bucket_sort': lambda s: np.sort(s, axis=-1),
}


def their_stack_apply(stack, actions):
  """The second half of their `_sample_expression_and_result`."""
  current_stack = list(stack)
  for action in actions:
    if action == 2:  # POP
      if current_stack:
        current_stack.pop()
    elif action in [3, 4]:  # PUSH a 0 (case 3) or a 1 (case 4)
      current_stack.append(action - 3)
  return np.concatenate([stack, actions]), current_stack[::-1]


def their_stack_expression(rs, length):
  if length == 1:
    value = rs.randint(low=0, high=2, size=(1,))
    return value, list(value)
  stack_length = rs.randint(low=1, high=length)
  stack = rs.randint(low=0, high=2, size=(stack_length,))
  actions = rs.randint(low=2, high=5, size=(length - stack_length,))
  return their_stack_apply(stack, actions)


def their_stack_draw(rs, batch_size, length):
  return [their_stack_expression(rs, length) for _ in range(batch_size)]


def their_stack_every(length):
  if length == 1:
    return [(np.array([v]), [v]) for v in (0, 1)]
  return [their_stack_apply(np.array(s), np.array(a, dtype=np.int64))
          for k in range(1, length)
          for s in itertools.product((0, 1), repeat=k)
          for a in itertools.product((2, 3, 4), repeat=length - k)]


def their_stack_build(drawn, length):
  """The rest of their `sample_batch`, output_size 3."""
  expressions, results = [], []
  for expression, result in drawn:
    result = list(result)
    expressions.append(expression)
    result += [3 - 1]
    result += [0] * (length + 1 - len(result))
    results.append(result)
  return np.array(expressions), np.array(results)


def their_missing_draw(rs, batch_size, length):
  if length == 1:
    return batch_size
  strings_ = rs.randint(0, 2, size=(batch_size, length // 2))
  indices = rs.randint(0, 2 * (length // 2), size=(batch_size,))  # duplicated_strings.shape[1]
  return strings_, indices


def their_missing_every(length):
  if length == 1:
    return 1
  pairs = list(itertools.product(itertools.product((0, 1), repeat=length // 2),
                                 range(2 * (length // 2))))
  return np.array([s for s, _ in pairs]), np.array([i for _, i in pairs])


def their_missing_build(drawn, length):
  if length == 1:  # their special case: inputs and outputs 1
    return np.ones((drawn, length), np.int64), np.ones((drawn, 1), np.int64)
  strings_, indices = drawn
  batch_size = len(indices)
  duplicated_strings = np.concatenate((strings_, strings_), axis=-1)
  output = duplicated_strings[np.arange(batch_size), indices]
  masked_strings = duplicated_strings.copy()
  masked_strings[np.arange(batch_size), indices] = 2
  padding = np.full((batch_size, length % 2), fill_value=3)
  padded_strings = np.concatenate((masked_strings, padding), axis=-1)
  return padded_strings, output[:, None]


# name: (draw(rs, B, n), every(n), build(drawn, n) -> (x [B, n], y [B, out(n)]), our label)
LABELS = {'even_pairs': regular.label_even_pairs, 'parity_check': regular.label_parity_check,
          'cycle_navigation': regular.label_cycle_navigation,
          'reverse_string': strings.label_reverse, 'duplicate_string': strings.label_duplicate,
          'odds_first': strings.label_odds_first, 'bucket_sort': strings.label_bucket_sort}
THEIRS = {name: (_uniform_draw(VOCAB[name]), _uniform_every(VOCAB[name]),
                 lambda s, n, f=THEIR_OUTPUTS[name]: (s, f(s)), label)
          for name, label in LABELS.items()}
THEIRS['stack_manipulation'] = (their_stack_draw, their_stack_every, their_stack_build,
                                strings.label_stack)
THEIRS['missing_duplicate_string'] = (their_missing_draw, their_missing_every,
                                      their_missing_build, strings.label_missing_duplicate)
NAMES = sorted(THEIRS)
MAX_LENGTH = 12  # N of our samples
EVERY_UP_TO = {'cycle_navigation': 5, 'bucket_sort': 3, 'stack_manipulation': 6,
               'missing_duplicate_string': 10}  # all draws: at most 1,266 rows; else 8
SAMPLES = 20_000
# Compiling dominates on CPU, so every task runs in one program per shape: labels on
# [ROWS, WIDTH], samples on [SAMPLES, MAX_LENGTH] and [2, 500].
ROWS, WIDTH = 2048, 40


def _pad(a, rows, width):
  a = np.asarray(a)
  return np.pad(a, ((0, rows - a.shape[0]), (0, width - a.shape[1])))


@jax.jit
def _all_labels(xs, n):
  return {name: THEIRS[name][3](x, n) for name, x in xs.items()}


def _label(name, x, n):
  """Ours on x `[B, n]` (B <= ROWS, n <= WIDTH), zeros after: y `[B, output_length(WIDTH)]`."""
  xs = {other: jnp.zeros((ROWS, WIDTH), jnp.int32) for other in NAMES}
  xs[name] = jnp.asarray(_pad(x, ROWS, WIDTH), jnp.int32)
  return np.asarray(_all_labels(xs, jnp.int32(n))[name])[:len(x)]


TRACES = []


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _all_generate(key, length, batch_size, max_length, names):
  TRACES.append((batch_size, max_length))
  keys = jax.random.split(key, len(names))
  return {name: TASKS[name].generate(k, length, batch_size, max_length)
          for k, name in zip(keys, names)}


@functools.lru_cache(maxsize=None)
def _samples(n, batch_size=SAMPLES, max_length=MAX_LENGTH, names=tuple(NAMES)):
  """Ours under jit, n traced: {name: (x `[B, N]`, y `[B, output_length(N)]`)} in NumPy."""
  batches = _all_generate(jax.random.key(n), jnp.int32(n), batch_size, max_length, names)
  return {name: (np.asarray(x), np.asarray(y)) for name, (x, y) in batches.items()}


class SpecTest(chex.TestCase):

  def test_names_levels_sizes_lengths(self):
    self.assertEqual(sorted(regular.TASKS),
                     ['cycle_navigation', 'even_pairs', 'parity_check'])
    self.assertEqual(sorted(strings.TASKS),
                     ['bucket_sort', 'duplicate_string', 'missing_duplicate_string',
                      'odds_first', 'reverse_string', 'stack_manipulation'])
    # name: level, input_size, output_size, output_length(7), terminated (their properties).
    expected = {
        'even_pairs': ('regular', 2, 2, 1, False),
        'parity_check': ('regular', 2, 2, 1, False),
        'cycle_navigation': ('regular', 3, 5, 1, False),
        'reverse_string': ('context_free', 2, 2, 7, False),
        'stack_manipulation': ('context_free', 5, 3, 8, True),
        'duplicate_string': ('context_sensitive', 2, 2, 14, False),
        'odds_first': ('context_sensitive', 2, 2, 7, False),
        'bucket_sort': ('context_sensitive', 5, 5, 7, False),
        'missing_duplicate_string': ('context_sensitive', 4, 2, 1, False),
    }
    for name, task in TASKS.items():
      self.assertEqual(task.name, name)
      got = (task.level, task.input_size, task.output_size, task.output_length(7),
             task.terminated)
      self.assertEqual(got, expected[name], name)
      self.assertEqual(int(task.output_length(jnp.int32(7))), expected[name][3], name)
      self.assertEqual((task.input_length(7), int(task.input_length(jnp.int32(7)))), (7, 7))


class LabelTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*[(n, n) for n in NAMES])
  def test_every_draw_at_small_lengths_and_random_draws_to_40(self, name):
    draw, every, build, _ = THEIRS[name]
    rs = np.random.RandomState(0)
    small = [(n, every(n)) for n in range(1, EVERY_UP_TO.get(name, 8) + 1)]
    for n, drawn in small + [(n, draw(rs, 64, n)) for n in (9, 10, 11, 17, 32, 39, 40)]:
      x, y = build(drawn, n)
      ours, out = _label(name, x, n), TASKS[name].output_length(n)
      self.assertEqual(y.shape, (x.shape[0], out))
      np.testing.assert_array_equal(ours[:, :out], y, err_msg=f'{name} n={n}')
      self.assertFalse(ours[:, out:].any(), (name, n))

  def test_their_docstring_examples(self):
    cases = [
        ('even_pairs', '001110', '0'), ('even_pairs', '0101001', '1'),
        ('parity_check', '1010100', '1'), ('parity_check', '01111', '0'),
        # Their "1 -1 0 -1 -1 -> 3" and "1 1 1 -1 -> 2" as the code's symbols (move + 1).
        ('cycle_navigation', '20100', '3'), ('cycle_navigation', '2220', '2'),
        ('reverse_string', '011010', '010110'),
        ('duplicate_string', '101', '101101'), ('duplicate_string', '111111', '1' * 12),
        # Their docstring: 00110101 -> 0100 0111, 110 -> 10 1; their code: the reverse order.
        ('odds_first', '00110101', '01110100'), ('odds_first', '110', '110'),
        ('odds_first', '100', '010'),
        ('bucket_sort', '10204112', '00111224'),
        ('stack_manipulation', '0110422', '11020000'),
        # Their docstring pads this one to 8; output_length (input length + 1) is 7.
        ('stack_manipulation', '110222', '2000000'),
        ('missing_duplicate_string', '01100210', '1'),
        ('missing_duplicate_string', '1011213', '0'),
    ]
    for name, x, y in cases:
      ours = _label(name, np.array([[int(c) for c in x]]), len(x))
      self.assertEqual(''.join(map(str, ours[0, :len(y)])), y, (name, x))
      self.assertFalse(ours[0, len(y):].any(), (name, x))


def _structure_errors(name, x, n):
  """Why the rows of x `[B, n]` could not come from their sampler (empty: none)."""
  errors = []
  if name in VOCAB:
    if not ((x >= 0) & (x < VOCAB[name])).all():
      errors.append('symbol out of range')
  elif name == 'stack_manipulation':
    is_action = x >= 2
    if not ((x >= 0) & (x <= 4)).all():
      errors.append('symbol out of range')
    if n == 1 and is_action.any():
      errors.append('length 1 is one stack bit')
    if n > 1:
      if is_action[:, 0].any() or not is_action[:, -1].all():
        errors.append('a stack bit first, an action last')
      if (is_action[:, :-1] & ~is_action[:, 1:]).any():
        errors.append('bits, then actions')
  else:
    half = n // 2
    if n == 1:
      if not (x == 1).all():
        errors.append('length 1 is [1]')
      return errors
    body = x[:, :2 * half]
    if not (np.sum(body == 2, axis=1) == 1).all() or not np.isin(body, (0, 1, 2)).all():
      errors.append('one gap, bits')
    if not (x[:, 2 * half:] == 3).all():
      errors.append('fill only at the odd end')
    a, b = body[:, :half], body[:, half:]
    if not ((a == b) | (a == 2) | (b == 2)).all():
      errors.append('not a duplicated string')
  return errors


def _their_labels_of(name, x, n):
  """Their outputs `[B, output_length(n)]` for sampled inputs x `[B, n]`."""
  if name == 'stack_manipulation':  # their stack: the bits before the first action
    split = [n if n == 1 else int(np.argmax(r >= 2)) for r in x]
    return their_stack_build([their_stack_apply(r[:k], r[k:]) for r, k in zip(x, split)], n)[1]
  if name == 'missing_duplicate_string':  # their `output`: the gap's other copy
    if n == 1:
      return x[:, :1]
    body = x[:, :2 * (n // 2)]
    return np.max(np.where(body == 2, np.roll(body, n // 2, axis=1), 0), axis=1, keepdims=True)
  return THEIRS[name][2](x, n)[1]


class SampleTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*[(n, n) for n in NAMES])
  def test_batches_valid_and_labelled_as_theirs(self, name):
    task = TASKS[name]
    for n in range(1, MAX_LENGTH + 1):
      x, y = _samples(n)[name]
      out = task.output_length(n)
      chex.assert_shape([x, y], [(SAMPLES, MAX_LENGTH), (SAMPLES, task.output_length(MAX_LENGTH))])
      self.assertEqual((x.dtype, y.dtype), (np.int32, np.int32))
      self.assertFalse(x[:, n:].any() or y[:, out:].any(), (name, n, 'zeros past the length'))
      x, y = x[:, :n], y[:, :out]
      self.assertEqual(_structure_errors(name, x, n), [], (name, n))
      self.assertTrue(((y >= 0) & (y < task.output_size)).all(), (name, n))
      rows = 512 if name == 'stack_manipulation' else SAMPLES
      np.testing.assert_array_equal(y[:rows], _their_labels_of(name, x[:rows], n),
                                    err_msg=f'{name} n={n}')
    self.assertEqual(TRACES.count((SAMPLES, MAX_LENGTH)), 1, 'one trace for every length')

  def test_length_500_compiles_and_labels(self):
    # The stack machine is the one program that loops over N (a scan); the
    # others are gathers and sums, already run at N = 12 and labelled up to 40.
    for n in (1, 2, 499, 500):
      for name, (x, y) in _samples(n, 2, 500, ('stack_manipulation',)).items():
        out = TASKS[name].output_length(n)
        self.assertFalse(x[:, n:].any() or y[:, out:].any(), (name, n))
        self.assertEqual(_structure_errors(name, x[:, :n], n), [], (name, n))
        np.testing.assert_array_equal(y[:, :out], _their_labels_of(name, x[:, :n], n),
                                      err_msg=f'{name} n={n}')
    self.assertEqual(TRACES.count((2, 500)), 1)


def _distribution(rows):
  keys, counts = np.unique(np.asarray(rows), axis=0, return_counts=True)
  return {tuple(np.atleast_1d(k)): c / len(rows) for k, c in zip(keys, counts)}


def _total_variation(p, q):
  return 0.5 * sum(abs(p.get(k, 0) - q.get(k, 0)) for k in set(p) | set(q))


def _tolerance(outcomes, m1, m2):
  """Two samples of m1 and m2 draws over K outcomes, h = 1/m1 + 1/m2:
  E[TV] <= sqrt(K h) / 2 (Cauchy-Schwarz on the per-outcome standard
  deviations); one draw moves TV by at most 1/m, so (McDiarmid)
  P(TV > E + t) <= exp(-2 t^2 / h) = 6e-6 at t = sqrt(6 h)."""
  h = 1 / m1 + 1 / m2
  return 0.5 * np.sqrt(outcomes * h) + np.sqrt(6 * h)


def _their_samples(name):
  return 8000 if name == 'stack_manipulation' else SAMPLES  # theirs loops in Python


class DistributionTest(chex.TestCase, parameterized.TestCase):
  """Our samples against theirs: whole strings at small lengths, summaries at longer ones."""

  def _compare(self, ours, theirs, outcomes, msg):
    tv = _total_variation(_distribution(ours), _distribution(theirs))
    self.assertLess(tv, _tolerance(outcomes, len(ours), len(theirs)), msg)

  @parameterized.named_parameters(*[(n, n) for n in NAMES])
  def test_strings_as_theirs_at_small_lengths(self, name):
    draw, every, build, _ = THEIRS[name]
    rs = np.random.RandomState(2)
    for n in range(1, 6 if name == 'missing_duplicate_string' else 4):
      x, _ = _samples(n)[name]
      their_x, _ = build(draw(rs, _their_samples(name), n), n)
      outcomes = len(build(every(n), n)[0])  # all draws: an upper bound on the support
      self._compare(x[:, :n], their_x, outcomes, (name, n))

  @parameterized.named_parameters(*[(n, n) for n in NAMES if n in VOCAB or 'missing' in n])
  def test_classes_and_symbols_as_theirs_at_length_12(self, name):
    draw, _, build, _ = THEIRS[name]
    x, y = _samples(MAX_LENGTH)[name]
    their_x, their_y = build(draw(np.random.RandomState(3), SAMPLES, MAX_LENGTH), MAX_LENGTH)
    for j in range(MAX_LENGTH):  # each position's symbol
      self._compare(x[:, j:j + 1], their_x[:, j:j + 1], 5, (name, j))
    if y.shape[1] == 1:
      self._compare(y, their_y, TASKS[name].output_size, name)
    if 'missing' in name:
      self._compare(np.argmax(x == 2, axis=1)[:, None], np.argmax(their_x == 2, axis=1)[:, None],
                    MAX_LENGTH, 'gap position')

  def test_stack_lengths_as_theirs_at_length_12(self):
    n = MAX_LENGTH
    x, y = _samples(n)['stack_manipulation']
    their_x, their_y = their_stack_build(
        their_stack_draw(np.random.RandomState(4), _their_samples('stack_manipulation'), n), n)
    first_action = lambda a: np.argmax(a >= 2, axis=1)[:, None]  # their stack_length
    self._compare(first_action(x), first_action(their_x), n - 1, 'initial stack length')
    final = lambda a: np.argmax(a == 2, axis=1)[:, None]  # where the terminator is
    self._compare(final(y), final(their_y), n + 1, 'final stack length')
    self._compare(x[:, -1:], their_x[:, -1:], 3, 'last action')


if __name__ == '__main__':
  absltest.main()
