"""The regular tasks whose official sampler is uniform strings: even_pairs,
parity_check, cycle_navigation (google-deepmind/randomized_positional_encodings
`tasks/regular/{even_pairs,parity_check,cycle_navigation}.py`).
modular_arithmetic, regular too, is in `expressions.py`.

cycle_navigation's docstring calls the input symbols 0 (stay), 1 (right) and
-1 (left); its code draws symbols 0, 1, 2 and moves by `symbol - 1`, so
symbol 0 moves left, 1 stays and 2 moves right. We follow the code.

Each `label_*` is the official rule on an input `x` int32 `[B, N]` with
`n` real symbols (traced, one per batch): a class int32 `[B, 1]`.
"""

import jax
import jax.numpy as jnp

from attention_jax.lab.tasks.spec import TaskSpec

CYCLE_LENGTH = 5  # their `_cycle_length`


def real(x, n):
  """bool `[B, N]`: the first n positions."""
  return jnp.arange(x.shape[1])[None, :] < n


def uniform_symbols(key, n, batch_size: int, max_length: int, vocab: int):
  """Their `jrandom.randint(rng, (B, n), 0, vocab)`, zeros past n: `[B, N]`."""
  x = jax.random.randint(key, (batch_size, max_length), 0, vocab, jnp.int32)
  return jnp.where(real(x, n), x, 0)


def label_even_pairs(x, n):
  """The parity of the number of unequal neighbours (their `odd_unequal_pairs`)."""
  pairs = (x[:, :-1] != x[:, 1:]) & real(x[:, 1:], n - 1)
  return (jnp.sum(pairs, axis=1, keepdims=True) % 2).astype(jnp.int32)


def label_parity_check(x, n):
  """The parity of the number of ones."""
  return (jnp.sum(jnp.where(real(x, n), x, 0), axis=1, keepdims=True) % 2).astype(jnp.int32)


def label_cycle_navigation(x, n):
  """The final position on a cycle of 5, starting at 0, after moves `x - 1`:
  symbol 0 left, 1 stay, 2 right (their code, not their docstring)."""
  moves = jnp.where(real(x, n), x - 1, 0)
  return (jnp.sum(moves, axis=1, keepdims=True) % CYCLE_LENGTH).astype(jnp.int32)


def _uniform_task(name, vocab, output_size, label):
  def generate(key, n, batch_size, max_length):
    x = uniform_symbols(key, n, batch_size, max_length, vocab)
    return x, label(x, n)
  return TaskSpec(name, 'regular', vocab, output_size, generate)


TASKS = {
    'even_pairs': _uniform_task('even_pairs', 2, 2, label_even_pairs),
    'parity_check': _uniform_task('parity_check', 2, 2, label_parity_check),
    'cycle_navigation': _uniform_task('cycle_navigation', 3, CYCLE_LENGTH,
                                      label_cycle_navigation),
}
