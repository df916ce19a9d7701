"""Scaled dot-product attention: one head as a pure function, many by vmap.

Shapes are written in every docstring: T_q/T_k query/key lengths, D_k the
query/key width, D_v the value width, B batch, H heads. Masks are boolean with
True = attend; biases are additive.

Numerics: scores, bias and softmax are float32 whatever the input dtype
(float64 inputs, with x64 enabled, stay float64); masked
scores are replaced (`jnp.where`) by a finite large negative, never `-inf`; a
query row with no key to attend gets all-zero weights and a zero output, with
zero (finite) gradients.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from attention_jax.attention.masks import combine_masks
from attention_jax.attention.masks import structural_mask
from attention_jax.attention.scores import materialise

# Finite and far below any real score, with headroom so that `score - max`
# inside softmax cannot overflow to -inf (the same choice as jax.nn).
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def _check_broadcast(name: str, x: jnp.ndarray, target: tuple[int, ...]) -> None:
  if x.ndim > len(target) or any(
      d not in (1, t) for d, t in zip(x.shape[::-1], target[::-1])):
    raise ValueError(
        f'{name} has shape {x.shape}, which does not broadcast to {target}.')


def as_rank4(name: str, x: Optional[jnp.ndarray]) -> Optional[jnp.ndarray]:
  """A multi-head mask or bias, rank 2 `[T_q, T_k]` or rank 4 `[B|1, H|1, T_q,
  T_k]`, as rank 4. Rank 3 is refused: `[B, T, T]` and `[H, T, T]` cannot be
  told apart when B == H."""
  if x is None:
    return None
  if x.ndim == 2:
    return x[None, None]
  if x.ndim == 4:
    return x
  hint = (f' A rank-3 {name} is ambiguous ([B, T_q, T_k] or [H, T_q, T_k]?): '
          f'write {name}[:, None] for one per example, {name}[None] for one per head.'
          if x.ndim == 3 else '')
  raise ValueError(f'{name} has shape {x.shape}: give rank 2 [T_q, T_k] or rank 4 '
                   f'[B|1, H|1, T_q, T_k].{hint}')


def masked_softmax(scores: jnp.ndarray, mask: Optional[jnp.ndarray]) -> jnp.ndarray:
  """Softmax over the last axis of `scores`, restricted to `mask` (True = keep).

  Masked entries get exactly zero weight; a row with nothing kept is all
  zeros (not uniform, not NaN), with zero gradients. Computed in the dtype of
  `scores` (callers pass float32 or wider).
  """
  if mask is None:
    return jax.nn.softmax(scores, axis=-1)
  if mask.dtype != jnp.bool_:
    raise TypeError(f'mask must be boolean (True = attend), got {mask.dtype}.')
  weights = jax.nn.softmax(jnp.where(mask, scores, MASK_VALUE), axis=-1)
  # Only changes rows whose keys are all masked: softmax made them uniform.
  return jnp.where(mask, weights, 0.0)


def dot_product_attention(
    q: jnp.ndarray,
    k: jnp.ndarray,
    v: jnp.ndarray,
    *,
    mask: Optional[jnp.ndarray] = None,
    bias: Optional[jnp.ndarray] = None,
) -> tuple[jnp.ndarray, jnp.ndarray]:
  """One head of `softmax(q kᵀ / √D_k + bias) v` (lesson 7.2).

  Args:
    q: queries `[T_q, D_k]`.
    k: keys `[T_k, D_k]`.
    v: values `[T_k, D_v]`.
    mask: optional boolean `[T_q, T_k]` (or broadcastable), True = attend.
    bias: optional additive scores `[T_q, T_k]` (or broadcastable).

  Returns:
    `(out, weights)`: out `[T_q, D_v]` in the dtype of `v`; weights
    `[T_q, T_k]` in float32, each row summing to 1 over attended keys (all
    zeros for a row whose keys are all masked).
  """
  if q.ndim != 2 or k.ndim != 2 or v.ndim != 2:
    raise ValueError(
        'dot_product_attention takes one head: q [T_q, D_k], k [T_k, D_k], '
        f'v [T_k, D_v]; got q {q.shape}, k {k.shape}, v {v.shape}. '
        'Use multi_head_attention for [batch, length, heads, head_dim].')
  if q.shape[1] != k.shape[1] or k.shape[0] != v.shape[0]:
    raise ValueError(
        f'incompatible shapes: q {q.shape}, k {k.shape}, v {v.shape}; need '
        'q [T_q, D_k], k [T_k, D_k], v [T_k, D_v].')
  scores_shape = (q.shape[0], k.shape[0])
  compute_dtype = jnp.promote_types(jnp.result_type(q, k, v), jnp.float32)  # >= f32
  scores = jnp.einsum('qd,kd->qk', q, k, preferred_element_type=compute_dtype)
  scores = scores * (1.0 / (q.shape[1] ** 0.5))
  if bias is not None:
    _check_broadcast('bias', bias, scores_shape)
    scores = scores + bias.astype(compute_dtype)
  if mask is not None:
    _check_broadcast('mask', mask, scores_shape)
  weights = masked_softmax(scores, mask)
  out = jnp.einsum('qk,kd->qd', weights, v, preferred_element_type=compute_dtype)
  return out.astype(v.dtype), weights


def _vmap_plan(x: Optional[jnp.ndarray], axis: int, size: int):
  """(x, in_axis) mapping `axis` if it has `size`, else (x without it, None)."""
  if x is None:
    return None, None
  if x.shape[axis] == size:
    return x, axis
  return jnp.squeeze(x, axis), None


def repeat_kv_heads(k: jnp.ndarray, v: jnp.ndarray, num_heads: int, q_shape=None):
  """Grouped-query attention (Ainslie et al. 2023): k `[B, T_k, H_kv, D]`, v
  `[B, T_k, H_kv, D_v]` -> both with `num_heads` heads; query head h uses
  key/value head `h // (num_heads // H_kv)` (consecutive groups). H_kv = 1 is
  multi-query attention; H_kv = num_heads returns k, v unchanged."""
  h_kv = k.shape[2]
  if v.shape[2] != h_kv or h_kv < 1 or num_heads % h_kv:
    raise ValueError(
        f'incompatible shapes: key/value heads ({k.shape[2]} and {v.shape[2]}) must be equal and divide '
        f'the {num_heads} query heads' + (f' (q {q_shape})' if q_shape else '') + '.')
  if h_kv == num_heads:
    return k, v
  group = num_heads // h_kv
  return jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)


def multi_head_attention(
    q: jnp.ndarray,
    k: jnp.ndarray,
    v: jnp.ndarray,
    *,
    mask: Optional[jnp.ndarray] = None,
    bias: Optional[jnp.ndarray] = None,
) -> tuple[jnp.ndarray, jnp.ndarray]:
  """`dot_product_attention` vmapped over heads and batch (lesson 7.3).

  Args:
    q: queries `[B, T_q, H, D_k]`.
    k: keys `[B, T_k, H_kv, D_k]`; H_kv divides H (H_kv < H: grouped-query
      attention, see `repeat_kv_heads`).
    v: values `[B, T_k, H_kv, D_v]`.
    mask: optional boolean `[T_q, T_k]` or `[B|1, H|1, T_q, T_k]`, True = attend.
    bias: optional additive `[T_q, T_k]` or `[B|1, H|1, T_q, T_k]`; may differ
      per head (ALiBi). Rank 3 is an error (see `as_rank4`). Neither mask nor
      bias is ever broadcast in memory: a size-1 batch or head axis is shared
      across the vmap instead.

  Returns:
    `(out, weights)`: out `[B, T_q, H, D_v]` in the dtype of `v`; weights
    `[B, H, T_q, T_k]` in float32.
  """
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(
        'multi_head_attention takes [batch, length, heads, head_dim] arrays; '
        f'got q {q.shape}, k {k.shape}, v {v.shape}.')
  (b, t_q, h, d_k), t_k = q.shape, k.shape[1]
  if k.shape[:2] != (b, t_k) or k.shape[3] != d_k or v.shape[:2] != (b, t_k):
    raise ValueError(
        f'incompatible shapes: q {q.shape}, k {k.shape}, v {v.shape}; need '
        'q [B, T_q, H, D_k], k [B, T_k, H_kv, D_k], v [B, T_k, H_kv, D_v].')
  k, v = repeat_kv_heads(k, v, h, q.shape)
  full = (b, h, t_q, t_k)
  mask, bias = as_rank4('mask', mask), as_rank4('bias', bias)
  if mask is not None:
    _check_broadcast('mask', mask, full)
  if bias is not None:
    _check_broadcast('bias', bias, full)

  # The batch axis is 0 of mask/bias; once vmapped away, the head axis is 0.
  mask, mask_b = _vmap_plan(mask, 0, b)
  bias, bias_b = _vmap_plan(bias, 0, b)

  def one_example(q, k, v, mask, bias):
    mask, mask_h = _vmap_plan(mask, 0, h)
    bias, bias_h = _vmap_plan(bias, 0, h)
    per_head = jax.vmap(
        lambda q, k, v, m, b: dot_product_attention(q, k, v, mask=m, bias=b),
        in_axes=(1, 1, 1, mask_h, bias_h), out_axes=(1, 0))
    return per_head(q, k, v, mask, bias)

  return jax.vmap(one_example, in_axes=(0, 0, 0, mask_b, bias_b))(
      q, k, v, mask, bias)


def dense_kernel(q, k, v, *, mask, bias, slopes, causal, window, kv_lengths,
                 return_weights, **unused_options):
  """The 'dense' row of `dispatch.KERNELS`: structure and linear bias
  materialised, then `multi_head_attention`. Shapes as there; mask and bias
  rank 4 or None, slopes `[H]` or None. -> (out, weights or None)."""
  del unused_options  # other kernels' options (chunk sizes)
  t_q, t_k = q.shape[1], k.shape[1]
  mask = combine_masks(mask, structural_mask(t_q, t_k, causal=causal, window=window,
                                             kv_lengths=kv_lengths))
  out, weights = multi_head_attention(q, k, v, mask=mask,
                                      bias=materialise(bias, slopes, t_q, t_k))
  return out, (weights if return_weights else None)
