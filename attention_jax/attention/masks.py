"""Boolean attention masks, True = attend, broadcastable to [B, H, T_q, T_k]."""

from typing import Optional

import jax.numpy as jnp
import numpy as np

from attention_jax.attention.checks import as_bool_mask
from attention_jax.attention.checks import check_array
from attention_jax.attention.checks import check_count
from attention_jax.attention.checks import check_lengths
from attention_jax.attention.scores import relative_distance


def causal_mask(length: int) -> jnp.ndarray:
  """`[length, length]`: query i attends to keys j <= i."""
  check_count('causal_mask', 'length', length)
  return relative_distance(np.arange(length), np.arange(length)) >= 0


def sliding_window_mask(q_len: int, k_len: int, window: int) -> jnp.ndarray:
  """`[q_len, k_len]`: query i attends to keys j with `|i - j| < window`
  (Longformer/Mistral local attention; combine with `causal_mask` for the
  causal window `i - window < j <= i`).

  Indices, not positions: the window counts tokens, whatever the encoding."""
  for name, value in (('q_len', q_len), ('k_len', k_len), ('window', window)):
    check_count('sliding_window_mask', name, value)
  return jnp.abs(relative_distance(np.arange(q_len), np.arange(k_len))) < window


def structural_mask(t_q: int, t_k: int, *, causal: bool = False,
                    window: Optional[int] = None,
                    kv_lengths: Optional[jnp.ndarray] = None) -> Optional[jnp.ndarray]:
  """The dense form of the masks blockwise kernels build per block: causal
  (`j <= i`), a sliding `window` (`|i - j| < window`) and key padding
  (`j < kv_lengths[b]`, kv_lengths int `[B]`) -> boolean `[B|1, 1, T_q, T_k]`
  or None when there is none."""
  mask = None
  if causal:
    mask = causal_mask(t_q) if t_q == t_k else (
        relative_distance(np.arange(t_q), np.arange(t_k)) >= 0)
  if window is not None:
    mask = combine_masks(mask, sliding_window_mask(t_q, t_k, window))
  if mask is not None:
    mask = mask[None, None]
  if kv_lengths is not None:
    keys = jnp.arange(t_k)[None, None, None, :]
    mask = combine_masks(mask, keys < jnp.asarray(kv_lengths)[:, None, None, None])
  return mask


def attention_mask_from_tokens(token_mask: jnp.ndarray) -> jnp.ndarray:
  """Boolean token mask `[B, T]` (True = real token) -> `[B, 1, T, T]`.

  A pair (i, j) is attended only when both tokens are real, so a padded query
  row is fully masked: its output is zero (see `dot_product_attention`).
  """
  token_mask = as_bool_mask('token_mask', check_array('token_mask', token_mask))
  if token_mask.ndim != 2 or token_mask.dtype != jnp.bool_:
    raise ValueError(
        'token_mask must be boolean [batch, length], got '
        f'{token_mask.dtype}{list(token_mask.shape)}.')
  return token_mask[:, None, :, None] & token_mask[:, None, None, :]


def padding_mask(lengths: jnp.ndarray, max_length: int) -> jnp.ndarray:
  """Sequence lengths `[B]` -> `[B, 1, max_length, max_length]`.

  Positions `>= lengths[b]` are padding, neither attending nor attended.
  """
  max_length = check_count('padding_mask', 'max_length', max_length)
  lengths = check_array('lengths', lengths, ndim=1, kind='integer')
  lengths = check_lengths('lengths', lengths, lengths.shape[0], max_length)
  token_mask = jnp.arange(max_length)[None, :] < lengths[:, None]
  return attention_mask_from_tokens(token_mask)


def combine_masks(*masks: Optional[jnp.ndarray]) -> Optional[jnp.ndarray]:
  """Logical AND of the given masks (None entries skipped), broadcast together:
  boolean, or concrete float 0/1 (Flax's, converted); shapes that do not
  broadcast are refused."""
  masks = [as_bool_mask('masks', check_array('masks', m)) for m in masks if m is not None]
  if not masks:
    return None
  try:
    np.broadcast_shapes(*(m.shape for m in masks))
  except ValueError:
    raise ValueError(f'masks of shapes {[tuple(m.shape) for m in masks]} do not broadcast '
                     'together.') from None
  out = masks[0]
  for m in masks[1:]:
    out = jnp.logical_and(out, m)
  return out
