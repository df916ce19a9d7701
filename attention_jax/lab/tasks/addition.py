"""Multi-digit decimal addition, the task of the 2024 length-generalization
records (McLeish et al. 2024, Zhou et al. 2024, Cho et al. 2024), made on
device like the copy tasks.

Layout, for a decoder-only causal language model:

    BOS a_1 … a_la + b_1 … b_lb = s_1 … s_ls EOS PAD …

`a` and `b` have `la` and `lb` digits, drawn independently; `s = a + b`.
Digits are written least significant first (`reverse_operands=True`, the
default of McLeish's `--reverse_all` and of Zhou et al.); Cho et al.'s
addition configs reverse only the sum (`reverse_operands=False`: a and b
most significant first). The sum is always reversed, in all three. The
loss and every metric count only `s` and EOS (`loss_mask`), as `=` is our
SEP.

Numbers (Cho's `AdditionDataset`, src/data/addition.py): an n-digit operand
has a nonzero leading digit for n >= 2, and a 1-digit one is 0 … 9.
McLeish's bucket generator (create_data_split.py, `bucket_method_gen`)
draws 1-digit operands from 1 … 9 (0 only with `--keep_0_for_len_1`).
Operand lengths: McLeish's bucket method cycles through every (i, j) pair
equally; Cho draws i and j uniformly and independently. Ours draws them
independently and uniformly per example, the same distribution over pairs
(in expectation the bucket method's, too).

Options (`configure`, from the config's `task` group):
* `pad_zeros` (Cho's `padding=True`): a and b zero-padded to max(la, lb)
  digits and the sum to max(la, lb) + 1, so every example's layout depends
  on max(la, lb) only. Without it the sum has its own length (no leading
  zero).
* `index_hints` (Zhou et al. 2024; McLeish's `--index_hints`): a marker
  token before each digit, the same marker for the digits of one
  significance in a, b and s. The markers of an example are consecutive in
  a cyclic set of `num_hints` symbols (102 in both codes), starting at a
  random place drawn per example (McLeish's `pick_char_set`), in training
  and evaluation alike. The markers of `s` are part of the output.

Training only (`for_training`, never in an evaluation): `carry_mix`, the
fraction of training sums drawn carry-heavy, each digit of a and b 9 with
probability 1/2, else uniform as above (a leading digit stays nonzero). A
uniform sum rarely holds a long carry chain or a top column of 9 + 9
(1 in 81 equal-length sums), and those are what the hard set shows some
seeds failing (docs/addition.md); 0 (the papers') draws every sum uniformly.
Lee et al. 2023 ("Teaching Arithmetic to Small Transformers") balance their
training sums by the number of carries for the same reason; this mix is
ours, not theirs.

Position coupling (Cho et al. 2024, `AdditionDatasetWithCoupledPositions`
with reverse_output=True): a digit of significance k (1 = units) in a, b or
s gets id `offset + k`; `+` and `=` get `offset`; BOS, EOS and PAD get 0.
So `=` (which predicts s_1) and s_{k-1} (which predicts s_k) sit one id
below the digits they add, a length-independent offset.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.lab.tasks import hard_cases as hard
from attention_jax.lab.tasks.batches import BOS
from attention_jax.lab.tasks.batches import EOS
from attention_jax.lab.tasks.batches import NUM_SPECIAL
from attention_jax.lab.tasks.batches import PAD
from attention_jax.lab.tasks.batches import SEP
from attention_jax.lab.tasks.batches import check_lengths

DIGIT0 = NUM_SPECIAL  # digit d is token DIGIT0 + d
PLUS = NUM_SPECIAL + 10
HINT0 = NUM_SPECIAL + 11  # index hint h is token HINT0 + h
DIGITS = tuple(range(DIGIT0, DIGIT0 + 10))
OPTIONS = ('reverse_operands', 'pad_zeros', 'index_hints', 'num_hints')


@dataclasses.dataclass(frozen=True)
class Addition:
  """`a + b = s`; `lengths` are int32 `[B, 2]` (digits of a and of b) or
  `[B]` (both operands that long)."""
  name: str = 'addition'
  reverse_operands: bool = True
  pad_zeros: bool = False
  index_hints: bool = False
  num_hints: int = 102
  pack: int = 1  # examples per training sequence
  pack_segments: int = 0  # > 0: rows of this many padded examples' tokens, isolated examples
  coupled_max_position: int = 0  # > 0: coupled position ids, all below this
  abacus_max_k: int = 0  # > 0: training batches carry an Abacus offset k in [0, this]
  # Training only (`for_training`): the fraction of sums drawn carry-heavy.
  carry_mix: float = 0.0
  digit_tokens = DIGITS  # what Abacus embeddings count
  has_seq2seq = False
  ceiling = False  # the sum is not copied from the input: no k-gram ceiling
  hard_set = 'carry chains, unequal operands, zeros'  # the kinds of its hard cases

  def hard_cases(self, n: int, vocab_size: int) -> list:
    """(case, (a, b)) of its hard set at n digits (`hard_cases.addition_cases`)."""
    del vocab_size  # decimal
    return hard.addition_cases(n)

  def with_inputs(self, inputs, vocab_size: int, max_length: int) -> hard.Fixed:
    """This task with its draw replaced by the sums `inputs`, pairs (a, b)."""
    del vocab_size
    numbers = hard.addition_numbers(self, inputs, max_length)
    lengths = [[len(str(a)), len(str(b))] for a, b in inputs]
    return hard.Fixed(self, lengths, max_length,
                            lambda key: self._layout(*numbers, key, max_length))

  def configure(self, task_config) -> 'Addition':
    """This task with the options `task_config` (the config's `task` group)
    sets; a ValueError names a bad value."""
    options = {k: task_config[k] for k in OPTIONS if k in task_config}
    for k in ('reverse_operands', 'pad_zeros', 'index_hints'):
      if k in options and not isinstance(options[k], bool):
        raise ValueError(f'task.{k}={options[k]!r} must be True or False.')
    hints = options.get('num_hints', self.num_hints)
    if isinstance(hints, bool) or not isinstance(hints, int) or hints < 1:
      raise ValueError(f'task.num_hints={hints!r} must be an integer >= 1.')
    if task_config.get('vocab_size', 10) != 10:
      raise ValueError(f"task.vocab_size={task_config.get('vocab_size')!r}: addition's "
                       'symbols are the 10 decimal digits; set task.vocab_size=10.')
    return dataclasses.replace(self, **options)

  def for_training(self, task_config) -> 'Addition':
    """This task with `task.carry_mix` (module docstring) when the config
    sets it; a ValueError names a bad value."""
    mix = task_config.get('carry_mix', 0.0)
    if isinstance(mix, bool) or not isinstance(mix, (int, float)) or not 0 <= mix <= 1:
      raise ValueError(f'task.carry_mix={mix!r} must be a number in [0, 1] (the fraction of '
                       'training sums drawn carry-heavy; 0 = uniform only).')
    return dataclasses.replace(self, carry_mix=float(mix))

  def num_symbols(self, vocab_size: int) -> int:
    """Token ids past the special ones: the digits, '+', the hints."""
    del vocab_size
    return 11 + (self.num_hints if self.index_hints else 0)

  @property
  def width(self) -> int:
    """Tokens per digit: 2 with index hints (hint, digit), else 1."""
    return 2 if self.index_hints else 1

  def sequence_length(self, max_length: int) -> int:
    """Tokens in `BOS a + b = s EOS` for operands of up to `max_length` digits."""
    return 4 + self.width * (3 * max_length + 1)

  def max_number_length(self, max_length: int) -> int:
    """Digits of the longest number (the sum) with operands up to `max_length`."""
    return max_length + 1

  def fixed_lengths(self, n, batch_size: int) -> jax.Array:
    """Evaluation lengths: `n` a scalar (both operands n digits) or a pair."""
    n = jnp.asarray(n, jnp.int32)
    return jnp.broadcast_to(n if n.ndim else n[None], (batch_size, 2))

  def sample_lengths(self, key, batch_size: int, min_length: int, max_length: int):
    """Digits of a and b, each uniform in [min_length, max_length], `[B, 2]`."""
    return jax.random.randint(key, (batch_size, 2), min_length, max_length + 1, jnp.int32)

  def numbers(self, key, lengths, max_length: int):
    """Digits, least significant first: a, b `[B, N]` and s `[B, N + 1]` (0
    past each number), and the lengths la, lb, ls `[B]` as written."""
    lengths = _pairs(lengths)
    la, lb = lengths[:, 0], lengths[:, 1]
    b_size = lengths.shape[0]
    i = jnp.arange(max_length, dtype=jnp.int32)[None]  # significance, 0-based
    ka, kb = jax.random.split(key)

    def draw(k, n):
      d = jax.random.randint(k, (b_size, max_length), 0, 10, jnp.int32)
      lead = jax.random.randint(jax.random.fold_in(k, 1), (b_size, max_length), 1, 10, jnp.int32)
      d = jnp.where((i == n[:, None] - 1) & (n[:, None] >= 2), lead, d)
      return jnp.where(i < n[:, None], d, 0)

    a, b = draw(ka, la), draw(kb, lb)
    if self.carry_mix:  # skipped at 0: the uniform draw's stream stays as it was
      a, b = self._carry_heavy(key, a, b, i < la[:, None], i < lb[:, None])
    zero = jnp.zeros((b_size, 1), jnp.int32)
    total = jnp.concatenate([a + b, zero], axis=1)  # [B, N + 1]

    def add(carry, column):
      value = column + carry
      return value // 10, value % 10

    _, s = jax.lax.scan(add, zero[:, 0], total.T)
    s = s.T
    top = jnp.maximum(la, lb)
    carried = jnp.take_along_axis(s, top[:, None], axis=1)[:, 0] > 0
    ls = top + 1 if self.pad_zeros else top + carried.astype(jnp.int32)
    if self.pad_zeros:
      la = lb = top
    return a, b, s, la, lb, ls

  def _carry_heavy(self, key, a, b, in_a, in_b):
    """`a`, `b` `[B, N]` with a `carry_mix` fraction of the examples made
    carry-heavy: each of their digits (inside the number, `in_a`, `in_b`)
    9 with probability 1/2, else as drawn."""
    heavy = jax.random.bernoulli(jax.random.fold_in(key, 11), self.carry_mix, (a.shape[0], 1))
    nines = jax.random.bernoulli(jax.random.fold_in(key, 12), 0.5, (2,) + a.shape)
    a = jnp.where(heavy & nines[0] & in_a, 9, a)
    b = jnp.where(heavy & nines[1] & in_b, 9, b)
    return a, b

  def example(self, key, lengths, vocab_size: int, max_length: int):
    """`BOS a + b = s EOS PAD …` int32 `[B, sequence_length]` and its output
    tokens (s and EOS), bool, same shape. `vocab_size` is unused (decimal)."""
    del vocab_size
    check_lengths(lengths, max_length)
    return self._layout(*self.numbers(key, lengths, max_length), key, max_length)

  def _layout(self, a, b, s, la, lb, ls, key, max_length: int):
    """`example`'s layout of `numbers`' digits and lengths; `key` draws the
    index hints' start."""
    w, total = self.width, self.sequence_length(max_length)
    p = jnp.arange(total, dtype=jnp.int32)[None]
    plus = 1 + w * la[:, None]
    ends_b = plus + w * lb[:, None]
    equals = ends_b + 1
    ends_s = equals + w * ls[:, None]
    hint_start = jax.random.randint(jax.random.fold_in(key, 7), (a.shape[0], 1), 0,
                                    self.num_hints, jnp.int32)

    def token(digits, start, count, reverse):
      q = p - start  # 0-based offset inside the number's slots
      k = q // w  # 0-based place in writing order
      significance = jnp.where(reverse, k, count - 1 - k)
      digit = jnp.take_along_axis(digits, jnp.clip(significance, 0, digits.shape[1] - 1), 1)
      hint = HINT0 + (hint_start + significance) % self.num_hints
      return jnp.where((q % w == 0) & (w == 2), hint, DIGIT0 + digit), significance

    ra = token(a, 1, la[:, None], self.reverse_operands)
    rb = token(b, plus + 1, lb[:, None], self.reverse_operands)
    rs = token(s, equals + 1, ls[:, None], True)
    in_a, in_b = (p >= 1) & (p < plus), (p > plus) & (p <= ends_b)
    in_s = (p > equals) & (p <= ends_s)
    tokens = jnp.select(
        [p == 0, in_a, p == plus, in_b, p == equals, in_s, p == ends_s + 1],
        [BOS, ra[0], PLUS, rb[0], SEP, rs[0], EOS], PAD).astype(jnp.int32)
    is_output = (p > equals) & (p <= ends_s + 1)
    return tokens, is_output

  def encode(self, a, b, vocab_size: int = 10, key=None):
    """One example of `a + b` (integers >= 0), laid out as `example` lays
    out a drawn one with `key` (the hint markers' start; default
    `jax.random.key(0)`), with placeholders in the sum's slots, as many as
    its longest possible length (a decoder writes them itself): int32
    tokens and bool output slots `[1, T]`, and the operand lengths `[1, 2]`."""
    del vocab_size
    for name, v in (('a', a), ('b', b)):
      if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise ValueError(f'addition: {name}={v!r} must be an integer >= 0 (the operands of '
                         'a + b, e.g. predict(123, 456)).')
    digits = [[int(d) for d in reversed(str(int(v)))] for v in (a, b)]
    la, lb = (len(d) for d in digits)
    top = max(la, lb)
    pad = lambda d, n: jnp.asarray([d + [0] * (n - len(d))], jnp.int32)
    ls = jnp.full((1,), top + 1, jnp.int32)
    la_, lb_ = ((ls - 1, ls - 1) if self.pad_zeros else
                (jnp.full((1,), la, jnp.int32), jnp.full((1,), lb, jnp.int32)))
    tokens, is_output = self._layout(pad(digits[0], top), pad(digits[1], top),
                                     jnp.zeros((1, top + 1), jnp.int32), la_, lb_, ls,
                                     jax.random.key(0) if key is None else key, top)
    return tokens, is_output, jnp.asarray([[la, lb]], jnp.int32)

  def decode(self, output_tokens, vocab_size: int = 10):
    """The sum (an int) a decoder wrote in its tokens before EOS (least
    significant digit first; with index hints, a marker before each digit),
    or None when they are not digits in that layout."""
    del vocab_size
    digits = [int(t) for t in output_tokens][self.width - 1::self.width]
    if not digits or any(not DIGIT0 <= t < DIGIT0 + 10 for t in digits):
      return None
    return int(''.join(str(t - DIGIT0) for t in reversed(digits)))

  def coupled_positions(self, tokens, lengths, offset) -> jax.Array:
    """int32 `[B, T]` coupled ids (module docstring) of `example`'s `tokens`
    `[B, T]` (the full sequence) of operand `lengths`, per-example `offset` `[B]`."""
    if self.index_hints:
      raise ValueError('index hints and coupled positions do not combine: the hints '
                       'are tokens without a significance of their own; use one or the other.')
    n = _pairs(lengths)
    la, lb = n[:, 0:1], n[:, 1:2]
    top = jnp.maximum(la, lb)
    if self.pad_zeros:
      la = lb = top
    p = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
    plus, equals = la + 1, la + lb + 2
    sig_a = jnp.where(self.reverse_operands, p, la + 1 - p)
    sig_b = jnp.where(self.reverse_operands, p - plus, plus + lb + 1 - p)
    sig_s = p - equals
    significance = jnp.select(
        [p == 0, p < plus, p == plus, p < equals, p == equals, tokens > EOS],
        [-1, sig_a, 0, sig_b, 0, sig_s], -1)  # EOS and PAD: id 0
    ids = jnp.where(significance >= 0, offset.astype(jnp.int32)[:, None] + significance, 0)
    return ids.astype(jnp.int32)

  def random_offsets(self, key, lengths, max_position: int) -> jax.Array:
    """Offsets `[B]` uniform in [1, max_position − max(la, lb) − 2], so the
    largest id (the sum's top digit) stays below `max_position` (Cho's
    start in [1, max_position − len(labels)], ids <= max_position)."""
    high = max_position - jnp.max(_pairs(lengths), axis=1) - 1  # exclusive
    return jax.random.randint(key, high.shape, 1, jnp.maximum(high, 2), jnp.int32)

  def check_max_position(self, max_position: int, max_length: int) -> None:
    if max_position < max_length + 3:
      raise ValueError(
          f'coupled positions: max_position={max_position} is below max operand '
          f'digits + 3 = {max_length + 3} (ids 0 … n + 2 at offset 1); raise '
          'positions.max_position or set it to 0 (auto).')


def _pairs(lengths: jax.Array) -> jax.Array:
  """int32 `[B, 2]` operand lengths from `[B, 2]` or `[B]` (both that long)."""
  lengths = jnp.asarray(lengths, jnp.int32)
  return lengths if lengths.ndim == 2 else jnp.stack([lengths, lengths], axis=1)
