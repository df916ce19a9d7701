"""Packed documents: segment ids, one integer per token, and the rule that
a query attends only to keys of its own segment.

A batch row may hold several documents one after another (packing). Each
token carries the id of its document, int `[B, T]`; query i attends key j
only where `q_ids[b, i] == kv_ids[b, j]`, on top of everything else the call
masks (causal, window, kv_lengths, a mask). This is the rule of splash
attention's `SegmentIds(q, kv)` and of MaxText's `decoder_segment_ids`;
`jax.nn.dot_product_attention` (jax 0.10) has no segment ids, only
per-example lengths.

Conventions:

* ids are non-negative integers; only equality matters, so any labelling of
  the documents works. A document is expected to be one contiguous run of
  the row (packing makes them so): the encodings that look at the keys
  between a key and its query (CoPE's counts, forgetting attention's gates,
  stick-breaking, MTA's convolution) then see only their own document.
* padding: give the padding tokens an id of their own (MaxText uses 0):
  they attend only among themselves and their outputs are finite, to be
  dropped from the loss; or pass different ids on the two sides
  (`padding_ids`: -1 for a padded query, -2 for a padded key, what
  `TransformerLM(padding_mask=)` does), and a padded query attends to
  nothing: its row is fully masked, its output zero, its gradients zero,
  never NaN (as every row with no key, `dense.py`).
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.attention.checks import check_array

# The ids `padding_ids` gives padded queries and keys: negative (real ids
# are >= 0) and different, so that a padded query meets no key.
PADDED_QUERY, PADDED_KEY = -1, -2


def _check_one(name: str, ids, b: int, t: int, length: str) -> jnp.ndarray:
  if not hasattr(ids, 'dtype'):  # a list or tuple; arrays and tracers keep theirs
    ids = np.asarray(ids)
  shape, dtype = np.shape(ids), ids.dtype
  if not (jnp.issubdtype(dtype, jnp.integer) and not jnp.issubdtype(dtype, jnp.bool_)):
    raise TypeError(f'{name} must be integer [batch, {length}] (one id per token), got '
                    f'dtype {jnp.dtype(dtype).name}.')
  if tuple(shape) != (b, t):
    raise ValueError(f'{name} has shape {tuple(shape)}; it must be [batch, {length}] = '
                     f'({b}, {t}).')
  return jnp.asarray(ids, jnp.int32)


def check_segment_ids(segment_ids, kv_segment_ids, b: int, t_q: int, t_k: int, *,
                      names=('segment_ids', 'kv_segment_ids')
                      ) -> Optional[tuple[jnp.ndarray, jnp.ndarray]]:
  """The call's segment ids as int32 (q ids `[B, T_q]`, kv ids `[B, T_k]`),
  or None without any. `kv_segment_ids` defaults to `segment_ids` (self-
  attention, T_q == T_k); giving only `kv_segment_ids` is refused. A
  TypeError for non-integer ids, a ValueError naming the shapes else;
  `names`: the two arguments as the caller calls them."""
  q_name, kv_name = names
  if segment_ids is None:
    if kv_segment_ids is not None:
      raise ValueError(f'{kv_name}= was given without {q_name}= (the queries\' ids): give '
                       f'both, or {q_name}= alone for self-attention.')
    return None
  q_ids = _check_one(q_name, segment_ids, b, t_q, 'T_q')
  if kv_segment_ids is None:
    if t_q != t_k:
      raise ValueError(f'{q_name}= alone stands for the keys too, which needs T_q == T_k, '
                       f'got {t_q} and {t_k}: give {kv_name}= [batch, T_k].')
    return q_ids, q_ids
  return q_ids, _check_one(kv_name, kv_segment_ids, b, t_k, 'T_k')


def segment_mask(q_ids: jnp.ndarray, kv_ids: jnp.ndarray) -> jnp.ndarray:
  """int `[B, T_q]`, `[B, T_k]` -> boolean `[B, 1, T_q, T_k]`, True where
  query and key are in the same segment (the dense form of what the
  blockwise kernels build per block)."""
  q_ids = check_array('q_ids', q_ids, ndim=2, kind='integer')
  kv_ids = check_array('kv_ids', kv_ids, ndim=2, kind='integer')
  if q_ids.shape[0] != kv_ids.shape[0]:
    raise ValueError(f'q_ids {tuple(q_ids.shape)} and kv_ids {tuple(kv_ids.shape)} must '
                     'have the same batch: [B, T_q] and [B, T_k].')
  return (q_ids[:, :, None] == kv_ids[:, None, :])[:, None]


def segment_positions(segment_ids) -> jnp.ndarray:
  """Positions that restart at 0 with each document: int `[B, T]` ids ->
  int32 `[B, T]`, each token's index in its run of equal ids (a new run
  wherever the id changes), what each document would have alone."""
  ids = check_array('segment_ids', segment_ids)
  if ids.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
    raise ValueError(f'segment_ids must be integer [batch, length], got '
                     f'{ids.dtype.name}{list(ids.shape)}.')
  index = jnp.arange(ids.shape[1], dtype=jnp.int32)[None, :]
  starts = jnp.concatenate([jnp.ones_like(ids[:, :1], bool), ids[:, 1:] != ids[:, :-1]], 1)
  return index - jax.lax.cummax(jnp.where(starts, index, 0), axis=1)


def padding_ids(segment_ids, padding_mask) -> tuple[jnp.ndarray, jnp.ndarray]:
  """(q ids, kv ids) int32 `[B, T]` from segment ids (or None: one document
  per row) and a boolean padding mask `[B, T]`, True = a real token:
  padded tokens get `PADDED_QUERY` as queries and `PADDED_KEY` as keys, so
  that they neither attend nor are attended (module docstring)."""
  padding_mask = jnp.asarray(padding_mask)
  if padding_mask.dtype != jnp.bool_ or padding_mask.ndim != 2:
    raise ValueError(f'padding_mask must be boolean [batch, length] (True = a real token), '
                     f'got {padding_mask.dtype.name}{list(padding_mask.shape)}.')
  ids = (jnp.zeros(padding_mask.shape, jnp.int32) if segment_ids is None
         else _check_one('segment_ids', segment_ids, *padding_mask.shape, 'T'))
  return (jnp.where(padding_mask, ids, PADDED_QUERY),
          jnp.where(padding_mask, ids, PADDED_KEY))
