"""What a task is: inputs and outputs of any layout and length, made on
device from `(key, length)`. Every task of the lab is one: copy, reverse and
duplicate (`copy.py`) and DeepMind's 15 length-generalization tasks
(`chomsky/`; Delétang et al. 2023, `google-deepmind/
neural_networks_chomsky_hierarchy`; Ruoss et al. 2023,
`google-deepmind/randomized_positional_encodings`, `tasks/`). A protocol
lays a task out for a model, and every protocol serves every task: the
causal decoder's `BOS x SEP y EOS` (`decoder.DecoderTask`) and the
bidirectional encoder's `x BLANK…` (`lab.protocols.encoder_layout`).

A task maps an input string `x` of symbols `0 … input_size-1` to an output
string `y` of classes `0 … output_size-1`, of `output_length(n)` symbols for
an input of length n (1 for a classification task). Shapes are fixed by the
longest length `N`:

  x: int32 `[B, input_length(N)]`, the first `input_length(n)` symbols real,
     zeros after them;
  y: int32 `[B, output_length(N)]`, the first `output_length(n)` real, zeros
     after them.

Two draws: `sample(key, length, B, N)`, one (traced) length for the whole
batch as DeepMind's `sample_batch` draws, and `sample_examples(key, lengths
[B], N)`, a length per example, as the decoder study draws.

`input_length(n)` is n except where the official code changes it
(modular_arithmetic makes an even length odd). `output_length` and
`input_length` work on Python ints and on int32 arrays alike (floor
division only), so shapes and masks come from one formula.

Tasks whose output ends with a termination symbol (`terminated`: stack
manipulation, binary addition and multiplication) score accuracy only up to
and including that symbol, as the official `accuracy_mask` does.

Tasks whose outputs are input symbols (`copies_inputs`: the copy family)
say which input each output copies (`rule`), so the decoder layout gives
outputs the inputs' token ids and can couple their positions; their
alphabet is an option (`with_alphabet`).
"""

import dataclasses
from typing import Callable, Optional

import jax

# 'context_free' is the papers' deterministic context-free (DCF).
LEVELS = ('regular', 'context_free', 'context_sensitive')


def same_length(n):
  return n


def one_output(n):
  return n * 0 + 1


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """One task: its sizes, lengths and generator (see the module docstring)."""
  name: str
  level: str  # one of LEVELS
  input_size: int  # input symbols 0 … input_size-1 (the encoder's blank is input_size)
  output_size: int  # output classes 0 … output_size-1
  # (key, length int32 [], batch_size, max_length) -> (x [B, input_length(N)], y [B, output_length(N)])
  generate: Optional[Callable[[jax.Array, jax.Array, int, int], tuple[jax.Array, jax.Array]]]
  output_length: Callable = one_output  # n -> symbols of y
  input_length: Callable = same_length  # n -> symbols of x
  terminated: bool = False  # accuracy counted up to the first maximal class (the terminator)

  copies_inputs = False  # outputs are input symbols (see the module docstring)

  def sample(self, key: jax.Array, length, batch_size: int, max_length: int):
    """(x, y) of `batch_size` examples, all of input length `length`."""
    return self.generate(key, length, batch_size, max_length)

  def sample_examples(self, key: jax.Array, lengths: jax.Array, max_length: int):
    """(x, y) of one example per entry of `lengths` `[B]`: each the
    one-length sampler's at its length, with a key of its own."""
    keys = jax.random.split(key, lengths.shape[0])
    x, y = jax.vmap(lambda k, n: self.sample(k, n, 1, max_length))(keys, lengths)
    return x[:, 0], y[:, 0]

  def with_alphabet(self, vocab_size: int) -> 'TaskSpec':
    """The task with `vocab_size` input symbols, where that is an option
    (`copies_inputs`); the fixed alphabet of the others."""
    del vocab_size
    return self
