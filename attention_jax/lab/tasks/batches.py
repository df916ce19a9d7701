"""Batches of the decoder protocol, made on device, for any task of the
task protocol (`tasks/__init__.py`): every `TaskSpec` through
`decoder.DecoderTask`, and addition.

Layout, for a decoder-only causal language model:

    BOS x_1 … x_n SEP y_1 … y_m EOS PAD …

with `x` the task's input and `y` its output. The model reads `tokens[:-1]`
and predicts `tokens[1:]`; the loss and every metric count only the output
tokens `y_1 … y_m EOS` (the `loss_mask`).

Batches are pure functions of `(key, step)` (plus static shapes), so they are
generated inside the compiled train step: no host data loop, and the same
stream on every run and after a resume. Examples in a batch have different
lengths and are right-padded. Under a causal mask padding sits after every
real token and so is never attended by one; it only has to be kept out of the
loss, which `loss_mask` does.

Three options ride on the task (set from a config by
`lab.config.facts.configured_task`): `pack`, examples packed per training
sequence (`packing.py`, examples seeing each other; evaluation stays one per
sequence), `pack_segments`, rows packed with examples that each see only
themselves (`packed_rows.py`: segment ids, padding removed), and
`coupled_max_position`, position coupling (`coupling.py`): the batches then
carry `positions`, the coupled ids, for the model to read.
"""

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.lab.tasks import packing
from attention_jax.positional.abacus import sample_offset
from attention_jax.positional.randomized import random_positions

PAD, BOS, SEP, EOS = 0, 1, 2, 3
NUM_SPECIAL = 4


def sequence_length(task, max_input_length: int) -> int:
  """Tokens in `BOS x SEP y EOS` for the longest input: the padded length."""
  return task.sequence_length(max_input_length)


def tokens_read(task, max_input_length: int) -> int:
  """Tokens a decoder-only model reads for the longest input (`inputs`'
  length): the sequence minus its last token."""
  return sequence_length(task, max_input_length) - 1


def check_lengths(lengths, max_input_length: int) -> None:
  """ValueError for concrete `lengths` (any shape: addition's are operand
  pairs) outside 1 … max_input_length: an input past the padded length would
  not fit its sequence, and the task would build it wrong (an operand padded
  by repeating a digit, its sum cut short) rather than fail. Traced lengths
  (inside a compiled step) are the caller's to draw in range."""
  if isinstance(lengths, jax.core.Tracer):
    return
  values = np.asarray(lengths)
  if values.size and (values.min() < 1 or values.max() > max_input_length):
    raise ValueError(f'input lengths {values.min()} … {values.max()} are outside 1 … '
                     f'max_input_length={max_input_length}: raise max_input_length to the '
                     'longest input, or draw the lengths within it.')


def make_batch(task, key: jax.Array, lengths: jax.Array, *,
               vocab_size: int, max_input_length: int) -> dict[str, jax.Array]:
  """Builds examples with input lengths `lengths` `[B]` (traced, each in
  1 … max_input_length), all padded to `sequence_length(task, max_input_length)`.

  Returns a dict of `[B, T]` arrays, T = sequence_length - 1:
    inputs: int32 tokens fed to the model (`tokens[:-1]`).
    targets: int32 next tokens (`tokens[1:]`).
    loss_mask: bool, True on output tokens (y and EOS) of `targets`.
  and `lengths` `[B]`. Symbols are `NUM_SPECIAL … NUM_SPECIAL + vocab_size - 1`.
  """
  check_lengths(lengths, max_input_length)
  tokens, is_output = task.example(key, lengths, vocab_size, max_input_length)
  batch = dict(inputs=tokens[:, :-1], targets=tokens[:, 1:],
               loss_mask=is_output[:, 1:], lengths=lengths)
  if task.coupled_max_position:  # evaluation: offset 1 (coupling.py)
    positions = task.coupled_positions(tokens, lengths, jnp.ones(lengths.shape[:1], jnp.int32))
    batch['positions'] = positions[:, :-1]
  return batch


def make_seq2seq_batch(task, key: jax.Array, lengths: jax.Array, *,
                       vocab_size: int, max_input_length: int) -> dict[str, jax.Array]:
  """The same examples as `make_batch` (same key, same x), laid out for an
  encoder-decoder (copy, reverse, duplicate): N = max_input_length, M =
  the task's output_length(N).

  Returns:
    source: int32 `[B, N]`, x then PAD.
    source_mask: bool `[B, N]`, True on x.
    decoder_inputs: int32 `[B, M + 1]`, BOS y_1 … y_m then PAD (teacher forcing).
    targets: int32 `[B, M + 1]`, y_1 … y_m EOS then PAD.
    loss_mask: bool `[B, M + 1]`, True on y and EOS.
    lengths: `[B]`.
  """
  if not task.has_seq2seq:
    raise ValueError(f'task {task.name!r} has no encoder-decoder layout (copy, reverse and '
                     'duplicate have).')
  check_lengths(lengths, max_input_length)
  x, y, nx, ny = task.symbols(key, lengths, vocab_size, max_input_length)
  b = lengths.shape[0]
  source_mask = jnp.arange(x.shape[1])[None, :] < nx
  y = jnp.concatenate([y, jnp.full((b, 1), PAD, jnp.int32)], axis=1)  # [B, M + 1]
  j = jnp.broadcast_to(jnp.arange(y.shape[1], dtype=jnp.int32)[None, :], y.shape)
  targets = jnp.select([j < ny, j == ny], [y, EOS], PAD).astype(jnp.int32)
  decoder_inputs = jnp.concatenate(
      [jnp.full((b, 1), BOS, jnp.int32), jnp.where(j < ny, y, PAD)[:, :-1]], axis=1)
  return dict(source=jnp.where(source_mask, x, PAD), source_mask=source_mask,
              decoder_inputs=decoder_inputs, targets=targets, loss_mask=j <= ny,
              lengths=lengths)


LAYOUTS = {'decoder_only': make_batch, 'seq2seq': make_seq2seq_batch}


def sample_lengths(key: jax.Array, batch_size: int, min_length: int,
                   max_length: int) -> jax.Array:
  """Input lengths uniform in [min_length, max_length], int32 `[batch_size]`."""
  return jax.random.randint(key, (batch_size,), min_length, max_length + 1, jnp.int32)


def with_random_positions(batch: dict[str, jax.Array], key: jax.Array,
                          max_position: int, draw: str = 'per_example',
                          ) -> dict[str, jax.Array]:
  """Adds `positions` `[B, T]`: sorted random positions from [0, max_position)
  (Ruoss et al. 2023) for the model to read instead of 0 … T-1, one sample
  per example or, `draw='per_batch'` (the official code), one shared by the
  batch (`positional.random_positions`)."""
  b, t = batch['inputs'].shape
  return dict(batch, positions=random_positions(key, b, t, max_position, draw))


def train_batch(task, seed: int, step: jax.Array, *, batch_size: int,
                min_length: int, max_length: int, vocab_size: int,
                layout: str = 'decoder_only', max_position: int = 0,
                draw: str = 'per_example') -> dict[str, jax.Array]:
  """The training batch of `step` for `seed`: the same on every run. With
  `max_position` > 0 (decoder-only layout), randomized positions too, drawn
  per example or per batch (`draw`, see `with_random_positions`). With
  `task.pack` > 1 or `task.coupled_max_position`, `_packed_batch`'s layout
  (packed examples, coupled positions with a random offset each). With
  `task.pack_segments` > 0, `packed_rows.packed_batch`'s rows (examples
  isolated by `segment_ids`, positions drawn per example)."""
  key = jax.random.fold_in(jax.random.key(seed), step)
  length_key, token_key = jax.random.split(key)
  if task.pack_segments:
    if layout != 'decoder_only':
      raise ValueError(f'task.pack_segments={task.pack_segments} needs the decoder_only '
                       f'layout, not {layout!r}.')
    # Its own stream; positions (coupled, randomized) drawn per packed example.
    # Imported here: packed_rows imports this module's PAD.
    from attention_jax.lab.tasks import packed_rows  # pylint: disable=import-outside-toplevel
    batch = packed_rows.packed_batch(task, key, batch_size=batch_size, min_length=min_length,
                                     max_length=max_length, vocab_size=vocab_size,
                                     max_position=max_position, draw=draw)
    max_position = 0
  elif task.pack > 1 or task.coupled_max_position:
    if layout != 'decoder_only':
      raise ValueError(f'task.pack={task.pack} / coupled positions need the decoder_only '
                       f'layout, not {layout!r}.')
    # Another stream (new options): plain batches keep theirs.
    batch = _packed_batch(task, key, batch_size=batch_size, min_length=min_length,
                          max_length=max_length, vocab_size=vocab_size)
  else:
    lengths = task.sample_lengths(length_key, batch_size, min_length, max_length)
    batch = LAYOUTS[layout](task, token_key, lengths, vocab_size=vocab_size,
                            max_input_length=max_length)
  if max_position:
    # A third stream: adding it leaves the tokens of every (seed, step) as they were.
    batch = with_random_positions(batch, jax.random.fold_in(key, 2), max_position, draw)
  if task.abacus_max_k:
    # Abacus (McLeish et al. 2024): one k per batch, as the official module draws it.
    batch = dict(batch, abacus_offset=sample_offset(jax.random.fold_in(key, 4),
                                                    task.abacus_max_k, batch_size))
  return batch


def _packed_batch(task, key: jax.Array, *, batch_size: int, min_length: int,
                  max_length: int, vocab_size: int) -> dict[str, jax.Array]:
  """`task.pack` examples per sequence (`packing.concatenate`), each with its
  own length and, with coupling, its own random offset. Returns `inputs`,
  `targets`, `loss_mask` `[B, T]` with T = pack · sequence_length − 1,
  `lengths` `[B, pack]` (`[B]` when pack = 1), and `positions` when coupled
  (contiguous 0 … T−1 otherwise: the model's default)."""
  k = task.pack
  keys = jax.random.split(jax.random.fold_in(key, 3), 3 * k).reshape(k, 3)
  lengths = jnp.stack([task.sample_lengths(keys[e, 0], batch_size, min_length, max_length)
                       for e in range(k)])  # [K, B] (or [K, B, 2]: one per operand)
  examples = [task.example(keys[e, 1], lengths[e], vocab_size, max_length)
              for e in range(k)]
  tokens = jnp.stack([t for t, _ in examples])  # [K, B, L]
  real = jnp.sum(tokens != PAD, axis=-1)  # tokens of each example (no PAD inside one)
  packed = packing.concatenate(tokens, real, PAD)
  is_output = packing.concatenate(jnp.stack([o for _, o in examples]), real, False)
  batch = dict(inputs=packed[:, :-1], targets=packed[:, 1:], loss_mask=is_output[:, 1:],
               lengths=jnp.moveaxis(lengths, 0, 1) if k > 1 else lengths[0])
  if task.coupled_max_position:
    positions = jnp.stack([
        task.coupled_positions(
            tokens[e], lengths[e],
            task.random_offsets(keys[e, 2], lengths[e], task.coupled_max_position))
        for e in range(k)])
    batch['positions'] = packing.concatenate(positions, real, 0)[:, :-1]
  return batch
