"""Randomized positions (Ruoss et al. 2023), for any encoding.

A model trained on lengths up to n only ever sees positions 0 … n-1, so at
length 4n most positions (and, for relative encodings, most distances) are
new to it. Randomized positional encodings train instead on a *sorted random
sample* of n distinct positions from [0, max_position), max_position well
above the longest test sequence: every position and every gap up to
max_position is seen in training, and only the order of positions carries
meaning. The encoding itself (sinusoidal, learned, RoPE, ALiBi, …) is
unchanged; only the positions fed to it are.

How many samples (`draw`):
  'per_example' (this project's default): each sequence of a batch gets its
      own sorted sample, so one batch covers many position sets.
  'per_batch' (the official code, github.com/google-deepmind/
      randomized_positional_encodings, models/positional_encodings.py
      `noisy_fixed_positional_encodings`: `jnp.sort(jax.random.choice(rng,
      jnp.arange(noise_max_length), shape=(sequence_length,), replace=False))`):
      one sorted sample per forward pass, shared by every sequence of the
      batch. Same marginal distribution per sequence; the batch's gradient
      averages over one position set instead of B of them.
Not reproduced here: for encodings applied inside attention (noisy RoPE,
relative, ALiBi) the official code draws a fresh sample in every layer
(`hk.next_rng_key()` per attention module), and its noisy relative / ALiBi
variants sample *distances* from [1, max) rather than positions. Here one
position set is drawn per sequence (or batch) and every layer reads it.

At evaluation the positions are drawn the same way (with the evaluation's
key), as in the authors' setup: the model never learned what evenly spaced
positions 0 … T-1 mean. `contiguous` evaluation is available to measure
exactly that mismatch.
"""

import jax
import jax.numpy as jnp

DRAWS = ('per_example', 'per_batch')


def random_positions(key: jax.Array, batch_size: int, length: int,
                     max_position: int, draw: str = 'per_example') -> jax.Array:
  """`length` distinct positions from [0, max_position) in increasing order,
  int32 `[batch_size, length]`: drawn per example ('per_example'), or once
  and shared by every row ('per_batch', the official code)."""
  if draw not in DRAWS:
    raise ValueError(f'randomized positions draw {draw!r}; choose one of {DRAWS}.')
  if length > max_position:
    raise ValueError(f'cannot draw {length} distinct positions from [0, {max_position}): '
                     f'max_position must be >= the sequence length {length}.')

  def one(k):
    return jnp.sort(jax.random.permutation(k, max_position)[:length]).astype(jnp.int32)

  if draw == 'per_batch':
    return jnp.broadcast_to(one(key), (batch_size, length))
  return jax.vmap(one)(jax.random.split(key, batch_size))
