"""Hard cases: the inputs a uniform draw almost never makes, by name.

Uniform operands rarely carry into the top digit of a sum, and uniform
strings over 16 symbols rarely repeat a long n-gram, so a model that fails
exactly there still scores ~99% on the uniform evaluation. These generators
name such inputs per evaluated length n (`evaluate.hard` scores them):

  addition (n = the longer operand's digits):
    9…9 + 1, 1 + 9…9, 9…9 + 9…9               carry chains through every digit
    9…9 + 9…9 (n−1), 9…9 (n−1) + 9…9           the chain into a digit only one operand has
    carry chain into the top digit             middle columns sum to 9, the units carry
    carry into the top digit                   the column below the top carries
    sum gains a digit                          the top column carries out
    1 digit + n digits, n digits + 1 digit     operands of very unequal length
    0 + 0, 0 + n digits, n digits + 0          zero operands
    internal zeros                             10…01-style and zero-heavy operands
  copy, reverse, duplicate (strings of n symbols):
    one symbol, two symbols, period 2, period 3,
    repeated 8-gram                            an 8-gram twice, followed by different
                                               symbols: longer than any lookup window of
                                               the default entries (mta_lookup reads 6)
  DeepMind's tasks under the suite's encoder protocol (`chomsky_cases`):
    one symbol (parity of all ones, bucket_sort of equal tokens, cycle_navigation
    moving one way), alternating, period 3, sorted and sorted descending, as
    `CHOMSKY` lists per task

A case exists only at the lengths where it can (`n ≥ 2` for a chain into
the top digit, `n ≥ 18` for two 8-grams and what follows them); random
digits and symbols are drawn from a generator seeded by n, so every model,
every seed and every rerun is scored on the same inputs.

A task owns its hard set (`tasks.protocol.Task`): `task.hard_set` names its
kinds ('' for none), `task.hard_cases(n, vocab_size)` gives `(case, input)`
pairs (`(a, b)` ints for addition, a list of symbols otherwise) from the
generators here, and `task.with_inputs(inputs, vocab_size, max_length)` is
`task` with its draw replaced by those inputs (`Fixed`), for
`tasks.make_batch` / `make_seq2seq_batch` to lay out exactly as they lay out
a drawn batch.
"""

from typing import Callable, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from attention_jax.lab.tasks.batches import NUM_SPECIAL

SAMPLES = 4  # draws per random case and length (the named chains are one sum each)
NGRAM = 8  # the repeated n-gram's length: above every default lookup window (6)
ALPHABET_CASES = ('one symbol', 'two symbols', 'period 2', 'period 3', f'repeated {NGRAM}-gram')


def _rng(n: int, salt: int) -> np.random.Generator:
  return np.random.default_rng([n, salt])


def _number(digits: Sequence[int]) -> int:
  """The integer of `digits`, least significant first."""
  return int(''.join(str(d) for d in reversed(list(digits))) or '0')


def _digits(rng: np.random.Generator, n: int) -> list[int]:
  """n random digits, least significant first, the top one nonzero for n >= 2."""
  d = [int(v) for v in rng.integers(0, 10, n)]
  if n >= 2:
    d[-1] = int(rng.integers(1, 10))
  return d


def addition_cases(n: int, samples: int = SAMPLES) -> list[tuple[str, tuple[int, int]]]:
  """The addition cases at length n (module docstring): (case, (a, b))."""
  if n < 1:
    raise ValueError(f'addition hard cases: n={n!r} must be >= 1 (digits of the longer operand).')
  nines, shorter = 10 ** n - 1, 10 ** (n - 1) - 1
  out = [('9…9 + 1', (nines, 1)), ('1 + 9…9', (1, nines)), ('9…9 + 9…9', (nines, nines))]
  if n >= 2:
    out += [('9…9 + 9…9 (n−1)', (nines, shorter)), ('9…9 (n−1) + 9…9', (shorter, nines))]
  draws = []
  rng = _rng(n, 1)
  for _ in range(samples):
    if n >= 2:
      # Units carry, every middle column sums to 9: the carry runs to the top.
      a, b = _digits(rng, n), _digits(rng, n)
      a[0] = int(rng.integers(1, 10))
      b[0] = int(rng.integers(10 - a[0], 10))
      for i in range(1, n - 1):
        a[i] = int(rng.integers(0, 10))
        b[i] = 9 - a[i]
      draws.append(('carry chain into the top digit', (_number(a), _number(b))))
      # Only the column below the top carries (the rest random).
      a, b = _digits(rng, n), _digits(rng, n)
      a[n - 2] = int(rng.integers(1, 10))
      b[n - 2] = int(rng.integers(10 - a[n - 2], 10))
      draws.append(('carry into the top digit', (_number(a), _number(b))))
    a, b = _digits(rng, n), _digits(rng, n)
    a[-1] = int(rng.integers(1, 10))
    b[-1] = int(rng.integers(10 - a[-1], 10))
    draws.append(('sum gains a digit', (_number(a), _number(b))))
    if n >= 2:
      d, long = int(rng.integers(0, 10)), _number(_digits(rng, n))
      draws += [('1 digit + n digits', (d, long)), ('n digits + 1 digit', (long, d))]
    draws += [('0 + n digits', (0, _number(_digits(rng, n)))),
              ('n digits + 0', (_number(_digits(rng, n)), 0))]
    if n >= 3:
      a, b = _digits(rng, n), _digits(rng, n)
      for d in (a, b):  # most inner digits 0
        for i in range(1, n - 1):
          d[i] = d[i] if rng.random() < 0.25 else 0
      draws.append(('internal zeros', (_number(a), _number(b))))
  if n == 1:
    out.append(('0 + 0', (0, 0)))
  if n >= 3:
    out.append(('internal zeros', (10 ** (n - 1) + 1, 10 ** (n - 1) + 1)))
  # Grouped by case, in a fixed order.
  names = list(dict.fromkeys([c for c, _ in out] + [c for c, _ in draws]))
  return [(c, x) for name in names for c, x in out + draws if c == name]


def string_cases(n: int, vocab_size: int,
                 samples: int = SAMPLES) -> list[tuple[str, list[int]]]:
  """The low-entropy strings of n symbols from `vocab_size` (module
  docstring): (case, symbols)."""
  if n < 1 or vocab_size < 2:
    raise ValueError(f'string hard cases: n={n!r} must be >= 1 and vocab_size={vocab_size!r} '
                     '>= 2.')
  rng = _rng(n, 2)
  out = [('one symbol', [0] * n), ('one symbol', [vocab_size - 1] * n)]
  for _ in range(samples):
    if n >= 2:
      pair = rng.choice(vocab_size, 2, replace=False)
      out.append(('two symbols', [int(pair[i]) for i in rng.integers(0, 2, n)]))
  for period in (2, 3):
    if n >= 2 * period and vocab_size >= period:
      for _ in range(2):
        unit = [int(s) for s in rng.choice(vocab_size, period, replace=False)]
        out.append((f'period {period}', (unit * n)[:n]))
  if n >= 2 * NGRAM + 2:
    for _ in range(2):
      gram = [int(s) for s in rng.integers(0, vocab_size, NGRAM)]
      first, second = (int(s) for s in rng.choice(vocab_size, 2, replace=False))
      gap = int(rng.integers(0, n - 2 * NGRAM - 2 + 1))
      rest = n - 2 * NGRAM - 2 - gap
      x = (gram + [first] + [int(s) for s in rng.integers(0, vocab_size, gap)] + gram
           + [second] + [int(s) for s in rng.integers(0, vocab_size, rest)])
      out.append((f'repeated {NGRAM}-gram', x))
  return out


def _chomsky(n: int, vocab: int, kinds: Sequence[str]) -> list[tuple[str, list[int]]]:
  """Strings of n symbols from `vocab` of the named kinds (where n allows)."""
  out = []
  for kind in kinds:
    if kind == 'one symbol':
      out += [(kind, [s] * n) for s in range(vocab)]
    elif kind == 'alternating' and n >= 2:
      out.append((kind, ([0, 1] * n)[:n]))
    elif kind == 'period 3' and n >= 6:
      out.append((kind, ([0, 0, 1] * n)[:n]))
    elif kind == 'sorted' and n >= vocab:
      out.append((kind, sorted(i * vocab // n for i in range(n))))
    elif kind == 'sorted descending' and n >= vocab:
      out.append((kind, sorted((i * vocab // n for i in range(n)), reverse=True)))
  return out


# DeepMind's tasks (`tasks/chomsky/`) with a hard set: the kinds of string
# each is scored on (`chomsky_cases`), all of them their uniform draws' rarest:
# parity of all ones, bucket_sort of all-equal or already sorted tokens,
# cycle_navigation moving one way only, the string tasks on one symbol.
CHOMSKY = {
    'even_pairs': ('one symbol', 'alternating'),
    'parity_check': ('one symbol', 'alternating'),
    'cycle_navigation': ('one symbol',),  # all left, all stay, all right
    'reverse_string': ('one symbol', 'alternating', 'period 3'),
    'duplicate_string': ('one symbol', 'alternating', 'period 3'),
    'odds_first': ('one symbol', 'alternating', 'period 3'),
    'bucket_sort': ('one symbol', 'sorted', 'sorted descending'),
}


def chomsky_cases(spec, n: int) -> list[tuple[str, list[int]]]:
  """The hard cases of DeepMind's task `spec` (a `TaskSpec`) at length n:
  (case, input symbols); [] for a task not in `CHOMSKY`."""
  if spec.name not in CHOMSKY:
    return []
  return _chomsky(n, spec.input_size, CHOMSKY[spec.name])


class Fixed:
  """`task` whose `example` (and `symbols`) give laid-out hard cases instead
  of drawing; every other attribute is `task`'s, so the batch functions lay
  them out as a drawn batch. Made by `task.with_inputs`: `lengths` `[B, 2]`
  (addition: operand digits) or `[B]`, what `tasks.make_batch` takes with
  them; `example(key)` the task's layout of the inputs; `symbols` their
  symbol arrays where the task has them (`DecoderTask.symbols`)."""

  def __init__(self, task, lengths, max_length: int, example: Callable,
               symbols: Optional[tuple] = None):
    self._task, self._max_length = task, max_length
    self._example, self._symbols = example, symbols
    self.lengths = jnp.asarray(lengths, jnp.int32)

  def __getattr__(self, name):
    return getattr(self._task, name)

  def _check(self, max_length):
    if max_length != self._max_length:
      raise ValueError(f'hard cases laid out for max_length={self._max_length}, asked for '
                       f'{max_length}.')

  def example(self, key, lengths, vocab_size, max_length):
    del lengths, vocab_size
    self._check(max_length)
    return self._example(key)

  def symbols(self, key, lengths, vocab_size, max_length):
    del key, lengths, vocab_size
    self._check(max_length)
    if self._symbols is None:
      raise AttributeError(f'{self._task.name} lays out no symbol arrays.')
    return self._symbols


def addition_numbers(task, pairs: Sequence[tuple[int, int]], max_length: int):
  """`Addition.numbers`' arrays for the given (a, b): digits least
  significant first a, b `[B, N]`, s `[B, N + 1]`, and la, lb, ls `[B]` as
  written (with `pad_zeros`, la = lb = the longer, ls one more)."""
  rows = {k: [] for k in ('a', 'b', 's', 'la', 'lb', 'ls')}
  for a, b in pairs:
    da, db, ds = (str(v)[::-1] for v in (a, b, a + b))
    if max(len(da), len(db)) > max_length:
      raise ValueError(f'hard case {a} + {b} has more than max_length={max_length} digits.')
    top = max(len(da), len(db))
    for k, d, size in (('a', da, max_length), ('b', db, max_length), ('s', ds, max_length + 1)):
      rows[k].append([int(c) for c in d] + [0] * (size - len(d)))
    rows['la'].append(top if task.pad_zeros else len(da))
    rows['lb'].append(top if task.pad_zeros else len(db))
    rows['ls'].append(top + 1 if task.pad_zeros else len(ds))
  return tuple(jnp.asarray(rows[k], jnp.int32) for k in ('a', 'b', 's', 'la', 'lb', 'ls'))


def string_symbols(task, strings: Sequence[Sequence[int]], vocab_size: int,
                    max_length: int):
  """`DecoderTask.symbols`' arrays for the given input strings: token ids x
  `[B, N]`, y `[B, output_length(N)]` (the task's rule applied) and their
  lengths nx, ny `[B, 1]`."""
  spec = task.spec.with_alphabet(vocab_size)
  if any(len(x) > max_length for x in strings):
    raise ValueError(f'a hard case is longer than max_length={max_length}.')
  x = jnp.asarray([list(s) + [0] * (max_length - len(s)) for s in strings], jnp.int32)
  n = jnp.asarray([len(s) for s in strings], jnp.int32)
  m = int(spec.output_length(max_length))
  j = jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32)[None], (len(strings), m))
  y = jnp.where(j < spec.output_length(n)[:, None], spec.rule(x, n, j), 0)
  return NUM_SPECIAL + x, NUM_SPECIAL + y, n[:, None], spec.output_length(n)[:, None]
