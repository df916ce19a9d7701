"""Batches of the encoder protocol, and its randomized positions, as
DeepMind's code makes them (google-deepmind/randomized_positional_encodings,
`experiments/training.py`, `models/transformer.py`, `models/
positional_encodings.py`).

The encoder reads the input followed by one blank token per output symbol
and writes every output at once, in the blanks' slots:

    x_1 … x_nx  BLANK × ny  PAD …         (BLANK = PAD = input_size)

One length n per batch (as their curriculum draws it); the batch is padded
to the longest length N so that one compiled program serves every n, and
the keys past `lengths` = nx + ny are masked, so the model computes what the
unpadded batch would give.

Randomized positions ('NAME:randomized') follow their code, not this
project's decoder-side `positional.randomized` (one draw per example):

* an encoding added to the embeddings (sinusoidal, learned) reads one
  sorted sample of T positions from [0, noise_max_length), shared by the
  batch (`noisy_fixed_positional_encodings`);
* RoPE draws such a sample anew in every layer (`hk.next_rng_key()` per
  attention module), the same one for queries and keys;
* ALiBi and the relative encoding sample *distances*: per layer, a sorted
  sample d_1 < … < d_{T-1} from [1, noise_max_length), and the pair (i, j)
  is at signed distance sign(i - j)·d_|i-j| (their symmetric
  `randomize_both_sides=False`).

`jax.random.choice(key, a, (T,), replace=False)` is `permutation(key, len(a))
[:T]`, so drawing the permutation once and keeping its first T = nx + ny
entries gives exactly their sample at that length with that key, whatever the
padding (`tests/lab/protocols/test_encoder.py` checks it against theirs).
They draw at evaluation as in training (their issue #1).
"""

from typing import Optional

import jax
import jax.numpy as jnp

from attention_jax.lab.tasks.batches import check_lengths
from attention_jax.lab.tasks.spec import TaskSpec

# How each randomized encoding draws (module docstring); others are refused.
NOISE_KINDS = {'sinusoidal': 'embedding', 'learned': 'embedding', 'rope': 'per_layer',
               'alibi': 'distances', 'relative': 'distances'}


def sequence_shape(task: TaskSpec, max_length: int) -> tuple[int, int]:
  """(input slots, output slots) of the padded layout at the longest length."""
  return int(task.input_length(max_length)), int(task.output_length(max_length))


def padded_slots(task: TaskSpec, max_length: int) -> int:
  """Tokens of the padded layout at the longest length N: the first of N + 1,
  2N + 1, 3N that holds input_length(N) + output_length(N), so that tasks
  share a few shapes (and their compiled programs: `trainer.Programs`)."""
  need = sum(sequence_shape(task, max_length))
  for slots in (max_length + 1, 2 * max_length + 1, 3 * max_length):
    if need <= slots:
      return slots
  return need


def encoder_batch(task: TaskSpec, key: jax.Array, length, *, batch_size: int,
                  max_length: int, slots: Optional[int] = None) -> dict[str, jax.Array]:
  """The task's batch at `length` (traced int32 scalar, 1 … max_length).

  Returns, with T = `slots` (default input_length(N) + output_length(N)):
    tokens: int32 `[B, T]`, x then blanks then padding (module docstring).
    lengths: int32 `[B]`, nx + ny: the real tokens.
    targets: int32 `[B, T]`, y in the blanks' slots, 0 elsewhere.
    output_mask: bool `[B, T]`, the blanks' slots: the loss sums over them.
    accuracy_mask: bool `[B, T]`, the slots the accuracy counts: every
      output, or (terminated tasks) up to the first maximal class, as their
      `accuracy_mask` (`argmax(argmax(target, -1), -1)`).
  """
  check_lengths(length, max_length)
  n = jnp.asarray(length, jnp.int32)
  x, y = task.sample(key, n, batch_size, max_length)
  slots_in, slots_out = sequence_shape(task, max_length)
  nx, ny = task.input_length(n), task.output_length(n)
  slots = slots_in + slots_out if slots is None else slots
  if slots < slots_in + slots_out:
    raise ValueError(f'{task.name} at length {max_length} needs {slots_in + slots_out} '
                     f'slots, got slots={slots}.')
  p = jnp.arange(slots, dtype=jnp.int32)[None, :]
  x_at = jnp.take_along_axis(x, jnp.broadcast_to(jnp.clip(p, 0, slots_in - 1),
                                                 (batch_size, p.shape[1])), axis=1)
  j = jnp.clip(p - nx, 0, slots_out - 1)
  y_at = jnp.take_along_axis(y, jnp.broadcast_to(j, (batch_size, p.shape[1])), axis=1)
  output_mask = jnp.broadcast_to((p >= nx) & (p < nx + ny), (batch_size, p.shape[1]))
  tokens = jnp.where(p < nx, x_at, task.input_size).astype(jnp.int32)
  targets = jnp.where(output_mask, y_at, 0).astype(jnp.int32)
  accuracy_mask = output_mask
  if task.terminated:
    real_y = jnp.where(jnp.arange(slots_out)[None, :] < ny, y, 0)
    stop = jnp.argmax(real_y, axis=1)[:, None]  # the first maximal class: the terminator
    accuracy_mask = output_mask & (p - nx <= stop)
  return dict(tokens=tokens, lengths=jnp.full((batch_size,), nx + ny, jnp.int32),
              targets=targets, output_mask=output_mask, accuracy_mask=accuracy_mask)


def sorted_sample(key: jax.Array, population: int, count, slots: int, offset: int = 0):
  """Their `jnp.sort(jax.random.choice(key, jnp.arange(offset, offset +
  population), (count,), replace=False))` in the first `count` of `slots`
  entries (int32 `[slots]`, count traced); the entries past it repeat the
  largest drawn value, so they stay valid positions (they sit in padding)."""
  if slots > population:
    raise ValueError(f'cannot draw {slots} distinct values from a range of {population} '
                     '(positions.max_position, their noise_max_length, must exceed the longest '
                     'sequence).')
  drawn = jax.random.permutation(key, population)[:slots].astype(jnp.int32)
  keep = jnp.arange(slots) < count
  ordered = jnp.sort(jnp.where(keep, drawn, population))
  return offset + jnp.where(keep, ordered, jnp.max(jnp.where(keep, drawn, 0)))


def noisy_positions(kind: str, key: jax.Array, lengths, *, slots: int, num_layers: int,
                    noise_max_length: int) -> dict[str, jax.Array]:
  """The randomized positions of one forward pass (module docstring), for a
  batch whose rows all have `lengths[0]` real tokens of `slots`:

    'embedding': {'positions': int32 `[slots]`};
    'per_layer': {'layer_positions': int32 `[num_layers, slots]`};
    'distances': {'distances': int32 `[num_layers, slots, slots]`}.
  """
  t = jnp.asarray(lengths)[0]
  if kind == 'embedding':
    return dict(positions=sorted_sample(key, noise_max_length, t, slots))
  keys = jax.random.split(key, num_layers)
  if kind == 'per_layer':
    return dict(layer_positions=jax.vmap(
        lambda k: sorted_sample(k, noise_max_length, t, slots))(keys))
  if kind == 'distances':
    def one(k):
      d = sorted_sample(k, noise_max_length - 1, t - 1, slots - 1, offset=1)
      table = jnp.concatenate([jnp.zeros((1,), jnp.int32), d])  # [slots]: d_0 = 0
      i = jnp.arange(slots)
      gap = i[:, None] - i[None, :]
      return jnp.sign(gap) * table[jnp.abs(gap)]
    return dict(distances=jax.vmap(one)(keys))
  raise ValueError(f'no randomized positions of kind {kind!r}; kinds: '
                   f'{sorted(set(NOISE_KINDS.values()))}.')
