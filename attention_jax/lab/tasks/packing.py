"""Several examples packed into one training sequence (Jelassi et al. 2024).

Their training data (sjelassi/transformers_ssm_copy, synthetic_exps/
data_utils.py, `CopyDataset`) concatenates `$x|x.` examples until the context
is full, the loss on every example's answer and final '.', so that each
example is read after others: distractors in the context, and positions far
beyond a single example's length. Ours packs exactly `pack` examples
(`task.pack`), each `BOS x SEP y EOS` with its own length, back to back, then
PAD to the fixed size `pack × sequence_length`: no example is cut (theirs
truncates the last one and masks it out). Evaluation stays one example per
sequence. The other packing, examples that do not see each other
(`task.pack_segments`), is `packed_rows.py`.
"""

import jax
import jax.numpy as jnp


def concatenate(arrays: jax.Array, lengths: jax.Array, fill) -> jax.Array:
  """Packs examples back to back.

  Args:
    arrays: `[K, B, L]`, example e of row b in `arrays[e, b, :lengths[e, b]]`.
    lengths: int `[K, B]`, each in 0 … L.
    fill: value after the last example.

  Returns:
    `[B, K·L]`: row b holds example 0's tokens, then example 1's, …, then `fill`.
  """
  k, b, l = arrays.shape
  lengths = lengths.astype(jnp.int32)
  starts = jnp.cumsum(lengths, axis=0) - lengths  # [K, B]
  t = jnp.arange(k * l, dtype=jnp.int32)[None, :]  # [1, K·L]
  example = jnp.sum(t[None] >= starts[:, :, None], axis=0) - 1  # [B, K·L]
  start = jnp.take_along_axis(starts.T, example, axis=1)
  length = jnp.take_along_axis(lengths.T, example, axis=1)
  offset = t - start
  flat = jnp.transpose(arrays, (1, 0, 2)).reshape(b, k * l)
  gathered = jnp.take_along_axis(flat, example * l + jnp.clip(offset, 0, l - 1), axis=1)
  return jnp.where(offset < length, gathered, jnp.asarray(fill, arrays.dtype))
