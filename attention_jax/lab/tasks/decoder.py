"""The decoder protocol for every `TaskSpec`: a causal decoder reads
`BOS x SEP` and writes `y EOS` one token at a time, scored by teacher-forced
token accuracy and by greedy generation's exact match
(`experiments.length_extrapolation`, `experiments.train`).

`DecoderTask(spec)` follows the task protocol of `lab/tasks/__init__.py`.
Token ids: the special ones (PAD, BOS, SEP, EOS), then the task's input
symbols (`NUM_SPECIAL + x`), then its output classes (`NUM_SPECIAL +
input_size + y`), so an input symbol and an output class never share an id;
a task whose outputs are input symbols (`spec.copies_inputs`: copy,
reverse, duplicate) writes them with the inputs' ids, which is what lets a
model copy them, couple their positions (`coupling.py`), lay them out for an
encoder-decoder, and bounds their accuracy by the k-gram ceiling
(`evaluate/ambiguity.py`). A classification task writes one class and EOS.
Each example has its own length (`spec.sample_examples`).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.lab.tasks import coupling
from attention_jax.lab.tasks import hard_cases as hard
from attention_jax.lab.tasks.batches import BOS
from attention_jax.lab.tasks.batches import EOS
from attention_jax.lab.tasks.batches import NUM_SPECIAL
from attention_jax.lab.tasks.batches import PAD
from attention_jax.lab.tasks.batches import SEP
from attention_jax.lab.tasks.batches import check_lengths
from attention_jax.lab.tasks.batches import sample_lengths
from attention_jax.lab.tasks.input_forms import check_input
from attention_jax.lab.tasks.spec import TaskSpec


@dataclasses.dataclass(frozen=True)
class DecoderTask:
  """A `TaskSpec` laid out for the causal decoder (module docstring)."""
  spec: TaskSpec
  pack: int = 1  # examples per training sequence
  pack_segments: int = 0  # > 0: rows of this many padded examples' tokens, isolated examples
  coupled_max_position: int = 0  # > 0: coupled position ids, all below this (copy family)
  abacus_max_k: int = 0
  digit_tokens = ()  # no digit runs for Abacus embeddings to count

  @property
  def name(self) -> str:
    return self.spec.name

  @property
  def has_seq2seq(self) -> bool:
    """`batches.make_seq2seq_batch` lays it out for the encoder-decoders."""
    return self.spec.copies_inputs

  @property
  def ceiling(self) -> bool:
    """Outputs copied from x: the k-gram ceiling applies."""
    return self.spec.copies_inputs

  @property
  def hard_set(self) -> str:
    """The kinds of its hard cases (`hard_cases`); '' for none."""
    return 'low-entropy strings' if self.spec.copies_inputs else ''

  def hard_cases(self, n: int, vocab_size: int) -> list:
    """(case, input symbols) of its hard set at length n (`hard_cases.string_cases`)."""
    if not self.hard_set:
      return []
    return hard.string_cases(n, self.spec.with_alphabet(vocab_size).input_size)

  def with_inputs(self, inputs, vocab_size: int, max_length: int) -> hard.Fixed:
    """This task with its draw replaced by the input strings `inputs`."""
    symbols = hard.string_symbols(self, inputs, vocab_size, max_length)
    return hard.Fixed(self, [len(x) for x in inputs], max_length,
                            lambda key: self._layout(*symbols, max_length), symbols)

  def configure(self, task_config) -> 'DecoderTask':
    del task_config  # the alphabet comes with each call (`vocab_size`); no other options
    return self

  def for_training(self, task_config) -> 'DecoderTask':
    del task_config  # trained on the distribution it is scored on
    return self

  def num_symbols(self, vocab_size: int) -> int:
    spec = self.spec.with_alphabet(vocab_size)
    return spec.input_size + (0 if spec.copies_inputs else spec.output_size)

  def sequence_length(self, max_length: int) -> int:
    return int(self.spec.input_length(max_length)) + int(self.spec.output_length(max_length)) + 3

  def max_number_length(self, max_length: int) -> int:
    return max(int(self.spec.input_length(max_length)), int(self.spec.output_length(max_length)))

  def fixed_lengths(self, n, batch_size: int) -> jax.Array:
    return jnp.full((batch_size,), n, jnp.int32)

  def sample_lengths(self, key, batch_size: int, min_length: int, max_length: int):
    return sample_lengths(key, batch_size, min_length, max_length)

  def symbols(self, key, lengths, vocab_size: int, max_length: int):
    """The examples' token ids: x `[B, input_length(N)]`, y `[B,
    output_length(N)]`, and their real lengths nx, ny int32 `[B, 1]`."""
    spec = self.spec.with_alphabet(vocab_size)
    x, y = spec.sample_examples(key, lengths, max_length)
    n = lengths.astype(jnp.int32)[:, None]
    first_class = NUM_SPECIAL + (0 if spec.copies_inputs else spec.input_size)
    return NUM_SPECIAL + x, first_class + y, spec.input_length(n), spec.output_length(n)

  def example(self, key, lengths, vocab_size: int, max_length: int):
    """`BOS x SEP y EOS PAD …` int32 `[B, sequence_length]`, and its output
    tokens (y and EOS), bool, same shape."""
    check_lengths(lengths, max_length)
    return self._layout(*self.symbols(key, lengths, vocab_size, max_length), max_length)

  def _layout(self, x, y, nx, ny, max_length: int):
    """`example`'s layout of token ids x `[B, input_length(N)]` and y `[B,
    output_length(N)]`, of real lengths nx, ny `[B, 1]`."""
    b = x.shape[0]
    p = jnp.arange(self.sequence_length(max_length), dtype=jnp.int32)[None, :]
    x_at = jnp.take_along_axis(
        x, jnp.broadcast_to(jnp.clip(p - 1, 0, x.shape[1] - 1), (b, p.shape[1])), axis=1)
    y_at = jnp.take_along_axis(
        y, jnp.broadcast_to(jnp.clip(p - nx - 2, 0, y.shape[1] - 1), (b, p.shape[1])), axis=1)
    tokens = jnp.select(
        [p == 0, p <= nx, p == nx + 1, p < nx + 2 + ny, p == nx + 2 + ny],
        [BOS, x_at, SEP, y_at, EOS], PAD).astype(jnp.int32)
    return tokens, (p >= nx + 2) & (p <= nx + 2 + ny)

  def encode(self, inputs, vocab_size: int, key=None):
    """One example of the given input symbols (a sequence of ints in
    [0, input_size)), laid out as `example` lays out a drawn one, with
    placeholders in the output slots (a decoder writes them itself): int32
    tokens and bool output slots `[1, T]`, and its length `[1]`. `key` is
    unused: nothing but the input is drawn. Symbols that are no input of the
    task (`input_forms`: an operator inside an operand, an empty operand)
    are a ValueError naming the place."""
    del key
    spec = self.spec.with_alphabet(vocab_size)
    x = _symbols(inputs, spec.input_size, f'{self.name} input')
    check_input(self.name, x)
    n = next((n for n in range(1, len(x) + 1) if int(spec.input_length(n)) == len(x)), None)
    if n is None:
      takes = sorted({int(spec.input_length(k)) for k in range(1, len(x) + 2)})
      raise ValueError(f'{self.name}: an input of {len(x)} symbols is not one of its input '
                       f'lengths ({", ".join(map(str, takes))}, …).')
    ny = int(spec.output_length(n))
    first_class = NUM_SPECIAL + (0 if spec.copies_inputs else spec.input_size)
    tokens, is_output = self._layout(
        NUM_SPECIAL + jnp.asarray([x], jnp.int32), jnp.full((1, ny), first_class, jnp.int32),
        jnp.full((1, 1), len(x), jnp.int32), jnp.full((1, 1), ny, jnp.int32), n)
    return tokens, is_output, jnp.full((1,), n, jnp.int32)

  def decode(self, output_tokens, vocab_size: int):
    """The output symbols (a list of ints) of a decoder's tokens before EOS,
    or None when one of them is not an output symbol."""
    spec = self.spec.with_alphabet(vocab_size)
    first_class = NUM_SPECIAL + (0 if spec.copies_inputs else spec.input_size)
    classes = [int(t) - first_class for t in output_tokens]
    return classes if all(0 <= c < spec.output_size for c in classes) else None

  def coupled_positions(self, tokens, lengths, offset):
    self._check_coupled()
    return coupling.coupled_positions(self.spec, lengths, tokens.shape[1], offset)

  def random_offsets(self, key, lengths, max_position: int):
    self._check_coupled()
    return coupling.random_offsets(key, lengths, max_position)

  def check_max_position(self, max_position: int, max_length: int) -> None:
    self._check_coupled()
    coupling.check_max_position(max_position, max_length)

  def _check_coupled(self):
    if not self.spec.copies_inputs:
      raise ValueError(f'invalid config: coupled positions (:coupled) are defined for copy, '
                       f'reverse, duplicate and addition, not for {self.name}.')


def _symbols(values, size: int, what: str) -> list[int]:
  """`values` as a list of ints in [0, size); a ValueError names the first
  that is not (an empty list, a float, a token out of range)."""
  values = list(values) if not isinstance(values, (str, bytes)) else None
  if not values:
    raise ValueError(f'{what}: expected a non-empty sequence of integers in [0, {size}).')
  for v in values:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < size:
      raise ValueError(f'{what}: {v!r} is not a symbol; symbols are integers in [0, {size}).')
  return [int(v) for v in values]
