"""What one of DeepMind's length-generalization tasks is (Delétang et al.
2023, `google-deepmind/neural_networks_chomsky_hierarchy`; Ruoss et al. 2023,
`google-deepmind/randomized_positional_encodings`, `tasks/`).

A task maps an input string `x` of symbols `0 … input_size-1` to an output
string `y` of classes `0 … output_size-1`, of `output_length(n)` symbols for
an input of length n (1 for a classification task). The official code draws
one length per batch, so `generate` takes one (traced) length for the whole
batch and returns fixed shapes for the longest length `N`:

  x: int32 `[B, input_length(N)]`, the first `input_length(n)` symbols real,
     zeros after them;
  y: int32 `[B, output_length(N)]`, the first `output_length(n)` real, zeros
     after them.

`input_length(n)` is n except where the official code changes it
(modular_arithmetic makes an even length odd). `output_length` and
`input_length` work on Python ints and on int32 arrays alike (floor
division only), so shapes and masks come from one formula.

Tasks whose output ends with a termination symbol (`terminated`: stack
manipulation, binary addition and multiplication) score accuracy only up to
and including that symbol, as the official `accuracy_mask` does.
"""

import dataclasses
from typing import Callable

import jax

LEVELS = ('regular', 'context_free', 'context_sensitive')


def same_length(n):
  return n


def one_output(n):
  return n * 0 + 1


@dataclasses.dataclass(frozen=True)
class ChomskyTask:
  """One task: its sizes, lengths and generator (see the module docstring)."""
  name: str
  level: str  # one of LEVELS: 'context_free' is the papers' DCF
  input_size: int  # input symbols 0 … input_size-1 (the encoder's blank is input_size)
  output_size: int  # output classes 0 … output_size-1
  # (key, length int32 [], batch_size, max_length) -> (x [B, input_length(N)], y [B, output_length(N)])
  generate: Callable[[jax.Array, jax.Array, int, int], tuple[jax.Array, jax.Array]]
  output_length: Callable = one_output  # n -> symbols of y
  input_length: Callable = same_length  # n -> symbols of x
  terminated: bool = False  # accuracy counted up to the first maximal class (the terminator)
