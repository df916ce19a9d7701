"""DeepMind's tasks under this project's own protocol: a causal decoder
reads `BOS x SEP` and writes `y EOS` one token at a time, scored by
teacher-forced token accuracy and by greedy generation's exact match
(`experiments.length_extrapolation`, `experiments.train`), like copy.

`DecoderTask(spec)` follows the task protocol of `lab/tasks/__init__.py`.
Token ids: the special ones (PAD, BOS, SEP, EOS), then the task's input
symbols (`NUM_SPECIAL + x`), then its output classes (`NUM_SPECIAL +
input_size + y`), so an input symbol and an output class never share an
id. A classification task writes one class and EOS. Each example has its own
length, drawn as the study draws them; the example itself is the official
sampler's at that length (`ChomskyTask.generate` with a batch of one).
"""

import dataclasses

import jax
import jax.numpy as jnp

from attention_jax.lab.tasks.copy import BOS
from attention_jax.lab.tasks.copy import EOS
from attention_jax.lab.tasks.copy import NUM_SPECIAL
from attention_jax.lab.tasks.copy import PAD
from attention_jax.lab.tasks.copy import SEP
from attention_jax.lab.tasks.copy import sample_lengths
from attention_jax.lab.tasks.chomsky.spec import ChomskyTask


@dataclasses.dataclass(frozen=True)
class DecoderTask:
  """A `ChomskyTask` laid out for the causal decoder (module docstring)."""
  spec: ChomskyTask
  pack: int = 1  # examples per training sequence
  coupled_max_position: int = 0  # coupling is not defined for these tasks (refused)
  abacus_max_k: int = 0
  digit_tokens = ()  # no digit runs for Abacus embeddings to count
  has_seq2seq = False
  ceiling = False  # outputs are computed, not copied: no k-gram ceiling

  @property
  def name(self) -> str:
    return self.spec.name

  def configure(self, task_config) -> 'DecoderTask':
    del task_config  # the official defaults; no options of its own
    return self

  def num_symbols(self, vocab_size: int) -> int:
    del vocab_size  # the task's own alphabet, not the copy tasks' option
    return self.spec.input_size + self.spec.output_size

  def sequence_length(self, max_length: int) -> int:
    return int(self.spec.input_length(max_length)) + int(self.spec.output_length(max_length)) + 3

  def max_number_length(self, max_length: int) -> int:
    return max_length

  def fixed_lengths(self, n, batch_size: int) -> jax.Array:
    return jnp.full((batch_size,), n, jnp.int32)

  def sample_lengths(self, key, batch_size: int, min_length: int, max_length: int):
    return sample_lengths(key, batch_size, min_length, max_length)

  def example(self, key, lengths, vocab_size: int, max_length: int):
    """`BOS x SEP y EOS PAD …` int32 `[B, sequence_length]`, and its output
    tokens (y and EOS), bool, same shape."""
    del vocab_size
    spec = self.spec
    keys = jax.random.split(key, lengths.shape[0])
    x, y = jax.vmap(lambda k, n: spec.generate(k, n, 1, max_length))(keys, lengths)
    x, y = x[:, 0], y[:, 0]  # [B, input_length(N)], [B, output_length(N)]
    n = lengths.astype(jnp.int32)[:, None]
    nx, ny = spec.input_length(n), spec.output_length(n)
    p = jnp.arange(self.sequence_length(max_length), dtype=jnp.int32)[None, :]
    x_at = jnp.take_along_axis(
        x, jnp.broadcast_to(jnp.clip(p - 1, 0, x.shape[1] - 1), (x.shape[0], p.shape[1])), axis=1)
    y_at = jnp.take_along_axis(y, jnp.clip(p - nx - 2, 0, y.shape[1] - 1), axis=1)
    tokens = jnp.select(
        [p == 0, p <= nx, p == nx + 1, p < nx + 2 + ny, p == nx + 2 + ny],
        [BOS, NUM_SPECIAL + x_at, SEP, NUM_SPECIAL + spec.input_size + y_at, EOS],
        PAD).astype(jnp.int32)
    return tokens, (p >= nx + 2) & (p <= nx + 2 + ny)

  def coupled_positions(self, tokens, lengths, offset):
    raise ValueError(f'coupled positions are not defined for {self.name}.')

  def random_offsets(self, key, lengths, max_position: int):
    raise ValueError(f'coupled positions are not defined for {self.name}.')

  def check_max_position(self, max_position: int, max_length: int) -> None:
    raise ValueError(f'invalid config: coupled positions (:coupled) are defined for copy, '
                     f'reverse, duplicate and addition, not for {self.name}.')
