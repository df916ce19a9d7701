"""Randomized positions (Ruoss et al. 2023), for any encoding.

A model trained on lengths up to n only ever sees positions 0 … n-1, so at
length 4n most positions (and, for relative encodings, most distances) are
new to it. Randomized positional encodings train instead on a *sorted random
sample* of n distinct positions from [0, max_position), max_position well
above the longest test sequence: every position and every gap up to
max_position is seen in training, and only the order of positions carries
meaning. The encoding itself (sinusoidal, learned, RoPE, ALiBi, …) is
unchanged; only the positions fed to it are.

At evaluation the positions are drawn the same way (with the evaluation's
key), as in the authors' setup: the model never learned what evenly spaced
positions 0 … T-1 mean. `contiguous` evaluation is available to measure
exactly that mismatch.
"""

import jax
import jax.numpy as jnp


def random_positions(key: jax.Array, batch_size: int, length: int,
                     max_position: int) -> jax.Array:
  """Per example, `length` distinct positions from [0, max_position) in
  increasing order: int32 `[batch_size, length]`."""
  if length > max_position:
    raise ValueError(f'cannot draw {length} distinct positions from [0, {max_position}): '
                     f'max_position must be >= the sequence length {length}.')

  def one(k):
    return jnp.sort(jax.random.permutation(k, max_position)[:length]).astype(jnp.int32)

  return jax.vmap(one)(jax.random.split(key, batch_size))
