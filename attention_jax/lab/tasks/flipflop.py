"""Flip-flop language modeling (Liu, Ash, Goel, Krishnamurthy, Zhang,
NeurIPS 2023, "Exposing Attention Glitches with Flip-Flop Language
Modeling", arXiv 2306.00946): a 1-bit register's instructions, and the
bit each read returns, made on device like the copy tasks.

A sequence of n instructions, each followed by a bit:

    BOS w b  i b  i b  r b  w b  i b … r b

`w` writes its bit, `r` reads: its bit is the last one written, `i` is
ignored (its bit is noise). The first instruction is always `w` and the
last always `r`; the ones between are drawn independently, `i` with
probability p_ignore and `w`, `r` with (1 - p_ignore) / 2 each: the
distribution FFL(p_ignore) of the paper, whose released data
(huggingface.co/datasets/synthseq/flipflop) trains on FFL(0.8) with 256
instructions (512 tokens) and tests in distribution (FFL(0.8)), on sparse
sequences (FFL(0.98): long gaps between a write and its read) and on dense
ones (FFL(0.1): many writes close together). Every bit but the read ones is
a coin flip, so the loss and every metric count only the bits after an `r`
(`is_output`): token accuracy is the fraction of reads right, exact match
the fraction of sequences with every read right (1 - accuracy is the
paper's error rate).

The task's length is its number of instructions n (2n + 1 tokens with BOS).
Three tasks share the layout and differ in p_ignore: 'flipflop' (0.8, the
training distribution), 'flipflop_sparse' (0.98) and 'flipflop_dense'
(0.1); a study trains on 'flipflop' and scores the same models on the other
two (`eval.tasks`, `lab.config.facts.evaluation_tasks`), each row under its task's
name. `task.p_ignore` sets the training distribution of the task a config
names.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.lab.tasks.batches import BOS

from attention_jax.lab.tasks.batches import NUM_SPECIAL

from attention_jax.lab.tasks.batches import PAD
from attention_jax.lab.tasks.batches import check_lengths

WRITE, READ, IGNORE = NUM_SPECIAL, NUM_SPECIAL + 1, NUM_SPECIAL + 2
BIT0 = NUM_SPECIAL + 3  # bit b is token BIT0 + b
INSTRUCTIONS = 'wri'
# The paper's three distributions (FFL(p_ignore)), by task name.
P_IGNORE = {'flipflop': 0.8, 'flipflop_sparse': 0.98, 'flipflop_dense': 0.1}


@dataclasses.dataclass(frozen=True)
class FlipFlop:
  """FFL(p_ignore) sequences of `lengths` `[B]` instructions (module docstring)."""
  name: str = 'flipflop'
  p_ignore: float = 0.8
  pack: int = 1  # examples per training sequence
  pack_segments: int = 0  # > 0: rows of this many padded examples' tokens, isolated examples
  coupled_max_position: int = 0  # never > 0: no input for an output to couple with
  abacus_max_k: int = 0
  digit_tokens = ()  # no digit runs for Abacus embeddings to count
  has_seq2seq = False
  ceiling = False  # the read bit is not a k-gram lookup of the input
  # No hard set: its sparse and dense evaluation sets (flipflop_sparse,
  # flipflop_dense) are where it is hard.
  hard_set = ''

  def hard_cases(self, n: int, vocab_size: int) -> list:
    del n, vocab_size
    return []

  def with_inputs(self, inputs, vocab_size: int, max_length: int):
    raise ValueError(f'{self.name} has no hard set to lay out.')

  def __post_init__(self):
    _check_p_ignore(self.p_ignore, f'{self.name}: p_ignore')

  def configure(self, task_config) -> 'FlipFlop':
    """This task with `task.p_ignore` when the config names it (a sibling
    scored on the same models keeps its own); a ValueError names a bad
    value or a training length below 2 (a first `w` and a last `r`)."""
    out = self
    if task_config.get('name') == self.name and 'p_ignore' in task_config:
      out = dataclasses.replace(self, p_ignore=_check_p_ignore(
          task_config['p_ignore'], 'task.p_ignore'))
    low = task_config.get('train_min_length', 2)
    if isinstance(low, int) and low < 2:
      raise ValueError(f'task.train_min_length={low}: a flip-flop sequence has at least 2 '
                       'instructions (the first writes, the last reads); set it >= 2.')
    if task_config.get('vocab_size', 2) != 2:
      raise ValueError(f"task.vocab_size={task_config.get('vocab_size')!r}: flip-flop's data "
                       'are bits; set task.vocab_size=2.')
    return out

  def for_training(self, task_config) -> 'FlipFlop':
    del task_config  # FFL(p_ignore) in training, its siblings only scored
    return self

  def num_symbols(self, vocab_size: int) -> int:
    """Token ids past the special ones: w, r, i and the bits 0, 1."""
    del vocab_size
    return 5

  def sequence_length(self, max_length: int) -> int:
    """Tokens of `max_length` instructions: BOS and an (instruction, bit) pair each."""
    return 2 * max_length + 1

  def max_number_length(self, max_length: int) -> int:
    return max_length

  def fixed_lengths(self, n, batch_size: int) -> jax.Array:
    return jnp.full((batch_size,), n, jnp.int32)

  def sample_lengths(self, key, batch_size: int, min_length: int, max_length: int):
    return jax.random.randint(key, (batch_size,), min_length, max_length + 1, jnp.int32)

  def instructions(self, key, lengths, max_length: int):
    """Instruction indices (0 w, 1 r, 2 i; -1 past n) and bits `[B, N]`,
    the bits of reads already the last written one."""
    b = lengths.shape[0]
    n = lengths.astype(jnp.int32)[:, None]
    k = jnp.arange(max_length, dtype=jnp.int32)[None]
    kind_key, bit_key = jax.random.split(key)
    p_move = (1.0 - self.p_ignore) / 2
    drawn = jax.random.choice(kind_key, 3, (b, max_length),
                              p=jnp.asarray([p_move, p_move, self.p_ignore]))
    kinds = jnp.select([k == 0, k == n - 1, k < n], [0, 1, drawn], -1).astype(jnp.int32)
    bits = jax.random.bernoulli(bit_key, 0.5, (b, max_length)).astype(jnp.int32)
    # The last write at or before each instruction (the first always writes).
    last_write = jax.lax.cummax(jnp.where(kinds == 0, k, 0), axis=1)
    bits = jnp.where(kinds == 1, jnp.take_along_axis(bits, last_write, axis=1), bits)
    return kinds, jnp.where(kinds >= 0, bits, 0)

  def example(self, key, lengths, vocab_size: int, max_length: int):
    """`BOS w b … r b PAD …` int32 `[B, 2N + 1]` and its output tokens (the
    bits after a read), bool, same shape. `vocab_size` is unused (bits)."""
    del vocab_size
    check_lengths(lengths, max_length)
    kinds, bits = self.instructions(key, lengths, max_length)
    b = kinds.shape[0]
    pairs = jnp.stack([jnp.where(kinds >= 0, WRITE + kinds, PAD),
                       jnp.where(kinds >= 0, BIT0 + bits, PAD)], axis=2).reshape(b, -1)
    tokens = jnp.concatenate([jnp.full((b, 1), BOS, jnp.int32), pairs], axis=1)
    read = jnp.stack([jnp.zeros_like(kinds, bool), kinds == 1], axis=2).reshape(b, -1)
    is_output = jnp.concatenate([jnp.zeros((b, 1), bool), read], axis=1)
    return tokens.astype(jnp.int32), is_output

  def encode(self, text: str, vocab_size: int = 2, key=None):
    """One sequence written as the paper's text ('w1i0r1', the last bit a
    placeholder a decoder fills): int32 tokens and bool read bits `[1, T]`,
    and its length in instructions `[1]`. `key` is unused."""
    del vocab_size, key
    if (not isinstance(text, str) or len(text) < 4 or len(text) % 2
        or any(c not in INSTRUCTIONS for c in text[::2]) or any(c not in '01' for c in text[1::2])
        or text[0] != 'w' or text[-2] != 'r'):
      raise ValueError(f'flipflop: {text!r} is not a flip-flop sequence: pairs of an '
                       "instruction (w, r, i) and a bit (0, 1), the first 'w', the last 'r', "
                       "e.g. 'w1i0r1'.")
    ids = [BOS] + [WRITE + INSTRUCTIONS.index(c) if i % 2 == 0 else BIT0 + int(c)
                   for i, c in enumerate(text)]
    tokens = jnp.asarray([ids], jnp.int32)
    is_output = jnp.concatenate([jnp.zeros((1, 1), bool),
                                 jnp.roll(tokens == READ, 1, axis=1)[:, 1:]], axis=1)
    return tokens, is_output, jnp.full((1,), len(text) // 2, jnp.int32)

  def decode(self, output_tokens, vocab_size: int = 2):
    """The bits (a list of 0/1) of a decoder's read outputs, or None when
    one of them is not a bit."""
    del vocab_size
    bits = [int(t) - BIT0 for t in output_tokens]
    return bits if all(b in (0, 1) for b in bits) else None

  def coupled_positions(self, tokens, lengths, offset):
    raise self._no_coupling()

  def random_offsets(self, key, lengths, max_position: int):
    raise self._no_coupling()

  def check_max_position(self, max_position: int, max_length: int) -> None:
    raise self._no_coupling()

  def _no_coupling(self):
    return ValueError(f'invalid config: coupled positions (:coupled) are defined for copy, '
                      f'reverse, duplicate and addition, not for {self.name}.')


def _check_p_ignore(value, what: str) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not (
      0.0 <= value < 1.0):
    raise ValueError(f'{what}={value!r} must be a probability in [0, 1): the chance of an '
                     "ignore; writes and reads share the rest (1 leaves no 'w' or 'r').")
  return float(value)


TASKS = {name: FlipFlop(name, p) for name, p in P_IGNORE.items()}
