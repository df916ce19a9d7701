"""Packed rows with segment ids: several whole examples per training row,
each attending only to itself, as JAX trainers fill a batch (`task.pack_segments`).

With `task.pack_segments = K`, a training batch is `batch_size` rows of
`K × sequence_length` tokens. Examples are drawn as one stream and laid
into the rows back to back in the order drawn: an example that does not fit
what is left of a row starts the next row; PAD fills the end of a row. Each
token carries its example's segment id (1, 2, … within its row; 0 on the
PAD), which the model reads (`TransformerLM(segment_ids=)`): an example
attends only to its own tokens, at positions restarting at 0 (the model's
default from segment ids, `attention.segments.segment_positions`; coupled
and randomized positions are drawn per example and packed the same way).
So every example's logits are those it has alone, and the batch's loss
(the mean over every output token, `scoring.masked_metrics`) is that of the
same examples padded one per row: what packing removes is the padding, the
compute a padded batch spends on PAD.

Not `task.pack` (`packing.py`): there, Jelassi et al.'s examples share one
context on purpose (earlier examples are distractors, later ones sit at
large positions); here none sees another. The two do not combine.

The rows hold a varying number of examples (short ones fit more): the
examples of a step vary, their tokens per step much less. The stream is
long enough for rows of the shortest examples; the examples left over when
the last row is full are dropped, so the one example straddling the end of
the batch is lost, a long one more often than a short one: about one
example per batch, a slight lean toward short examples.
"""

import jax
import jax.numpy as jnp

from attention_jax.lab.tasks.batches import PAD
from attention_jax.positional.randomized import random_positions


def row_length(task, max_length: int) -> int:
  """Tokens per packed row: `task.pack_segments` padded examples' worth."""
  return task.pack_segments * task.sequence_length(max_length)


def stream_size(task, batch_size: int, min_length: int, max_length: int) -> int:
  """Examples drawn per batch: enough to fill every row with the shortest
  examples (`sequence_length(min_length)` tokens each; for addition, whose
  sums vary in length, nearly: a stream that ran out would leave the last
  rows emptier, never wrong)."""
  shortest = max(1, min(task.sequence_length(min_length), task.sequence_length(max_length)))
  return batch_size * (row_length(task, max_length) // shortest)


def assign_rows(sizes: jax.Array, batch_size: int, row: int) -> tuple[jax.Array, jax.Array]:
  """Lays a stream of examples of `sizes` tokens (int `[N]`, each <= row)
  into `batch_size` rows of `row` tokens, in order, each example where the
  previous one ended or at the start of the next row.

  Returns (row index, start within the row), int32 `[N]` each; an example
  past the last row has row index `batch_size` (dropped).
  """
  before = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(sizes, dtype=jnp.int32)])

  def next_first(first, _):
    # The examples first … last-1 fit a row: `before` is sorted, one search per row.
    last = jnp.searchsorted(before, before[first] + row, side='right') - 1
    return last.astype(jnp.int32), first

  _, firsts = jax.lax.scan(next_first, jnp.int32(0), None, length=batch_size)  # [rows]
  index = jnp.arange(sizes.shape[0], dtype=jnp.int32)
  rows = (jnp.searchsorted(firsts, index, side='right') - 1).astype(jnp.int32)
  last_end = jnp.searchsorted(before, before[firsts[-1]] + row, side='right') - 1
  rows = jnp.where(index < last_end, rows, batch_size)
  starts = before[index] - before[firsts[jnp.clip(rows, 0, batch_size - 1)]]
  return rows, starts.astype(jnp.int32)


def scatter(values: jax.Array, sizes: jax.Array, rows: jax.Array, starts: jax.Array,
            batch_size: int, row: int, fill) -> jax.Array:
  """Example i's first `sizes[i]` entries of `values` `[N, L]` at
  `[rows[i], starts[i] …]` of a `[batch_size, row]` array of `fill`."""
  n, l = values.shape
  t = jnp.arange(l, dtype=jnp.int32)[None, :]
  flat = rows[:, None] * row + starts[:, None] + t
  flat = jnp.where((t < sizes[:, None]) & (rows[:, None] < batch_size), flat, batch_size * row)
  out = jnp.full((batch_size * row,), fill, values.dtype)
  return out.at[flat.reshape(-1)].set(values.reshape(-1), mode='drop').reshape(batch_size, row)


def packed_batch(task, key: jax.Array, *, batch_size: int, min_length: int, max_length: int,
                 vocab_size: int, max_position: int = 0, draw: str = 'per_example'
                 ) -> dict[str, jax.Array]:
  """The training batch of `task.pack_segments` (module docstring).

  Returns `[B, T]` arrays, T = row_length − 1: `inputs`, `targets`,
  `loss_mask` (as `batches.make_batch`), `segment_ids` int32 (of `inputs`;
  0 on PAD), `positions` when coupled or randomized (`max_position` > 0,
  drawn `draw`-wise over the stream). Every array has a leading batch axis
  (data parallelism splits it).
  """
  n = stream_size(task, batch_size, min_length, max_length)
  row = row_length(task, max_length)
  keys = jax.random.split(jax.random.fold_in(key, 5), 4)
  lengths = task.sample_lengths(keys[0], n, min_length, max_length)
  tokens, is_output = task.example(keys[1], lengths, vocab_size, max_length)  # [N, L]
  sizes = jnp.sum(tokens != PAD, axis=-1).astype(jnp.int32)  # no PAD inside an example
  rows, starts = assign_rows(sizes, batch_size, row)
  place = lambda values, fill: scatter(values, sizes, rows, starts, batch_size, row, fill)
  ids = jnp.broadcast_to(
      (jnp.arange(n, dtype=jnp.int32) - jnp.searchsorted(rows, rows, side='left') + 1)[:, None],
      tokens.shape)
  packed, segment_ids = place(tokens, PAD), place(ids, 0)
  batch = dict(inputs=packed[:, :-1], targets=packed[:, 1:],
               loss_mask=place(is_output, False)[:, 1:], segment_ids=segment_ids[:, :-1])
  if task.coupled_max_position:
    offsets = task.random_offsets(keys[2], lengths, task.coupled_max_position)
    batch['positions'] = place(task.coupled_positions(tokens, lengths, offsets), 0)[:, :-1]
  elif max_position:
    positions = random_positions(keys[3], n, tokens.shape[1], max_position, draw)
    batch['positions'] = place(positions, 0)[:, :-1]
  return batch
