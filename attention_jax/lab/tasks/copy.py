"""The copy family — copy, reverse, duplicate — as tasks of the one kind
(`spec.TaskSpec`): uniform random strings over an alphabet that is an
option (`task.vocab_size`), and outputs that copy inputs by a rule.

  copy       y = x                 m = n    regular: a finite-state transducer
  reverse    y = x_n … x_1         m = n    context-free: a stack
  duplicate  y = x x               m = 2n   context-sensitive: ww

Their levels are those of DeepMind's reverse_string and duplicate_string
(copy, the identity, is regular), so they sit in the benchmark's figure
beside them under either protocol.

`rule(x [B, N], n [B], j [B, M]) -> y_j [B, M]` gives the j-th output token
(0-based) of inputs x of lengths n: the form `positional.coupled_position_ids`
reads to couple each output's position with the input it copies.
"""

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from attention_jax.lab.tasks.spec import TaskSpec


def copy_rule(x, n, j):
  del n
  return jnp.take_along_axis(x, j, axis=1)


def reverse_rule(x, n, j):
  return jnp.take_along_axis(x, jnp.clip(n[:, None] - 1 - j, 0, None), axis=1)


def duplicate_rule(x, n, j):
  return jnp.take_along_axis(x, j % jnp.maximum(n[:, None], 1), axis=1)


@dataclasses.dataclass(frozen=True)
class Times:
  """n -> k · n (a value, so that equal tasks compare equal)."""
  k: int

  def __call__(self, n):
    return self.k * n


@dataclasses.dataclass(frozen=True)
class CopyingTask(TaskSpec):
  """A task whose j-th output is the input `rule` points to; m = output_factor · n."""
  generate: None = None  # drawn by `sample_examples` (the strings do not depend on n)
  output_factor: int = 1
  rule: Callable = copy_rule

  copies_inputs = True

  def __post_init__(self):
    if self.output_length != Times(self.output_factor):
      raise ValueError(f'{self.name}: output_length must be Times(output_factor).')

  def sample(self, key, length, batch_size: int, max_length: int):
    lengths = jnp.full((batch_size,), length, jnp.int32)
    return self.sample_examples(key, lengths, max_length)

  def sample_examples(self, key, lengths, max_length: int):
    """x uniform on the alphabet, one draw for the batch `[B, N]` (zeros
    past each n), and y = rule(x) `[B, output_factor · N]` (zeros past m)."""
    b = lengths.shape[0]
    n = lengths.astype(jnp.int32)
    x = jax.random.randint(key, (b, max_length), 0, self.input_size, jnp.int32)
    j = jnp.broadcast_to(jnp.arange(self.output_factor * max_length, dtype=jnp.int32)[None],
                         (b, self.output_factor * max_length))
    y = jnp.where(j < self.output_factor * n[:, None], self.rule(x, n, j), 0)
    return jnp.where(jnp.arange(max_length)[None] < n[:, None], x, 0), y

  def with_alphabet(self, vocab_size: int) -> 'CopyingTask':
    if vocab_size == self.input_size:
      return self
    return dataclasses.replace(self, input_size=vocab_size, output_size=vocab_size)


def _copying(name: str, level: str, output_factor: int, rule: Callable,
             vocab_size: int = 16) -> CopyingTask:
  """Alphabet 16 by default, the study's (`configs/copy.py`)."""
  return CopyingTask(name, level, vocab_size, vocab_size, output_length=Times(output_factor),
                     output_factor=output_factor, rule=rule)


TASKS = {
    'copy': _copying('copy', 'regular', 1, copy_rule),
    'reverse': _copying('reverse', 'context_free', 1, reverse_rule),
    'duplicate': _copying('duplicate', 'context_sensitive', 2, duplicate_rule),
}
