"""Scaled dot-product attention: one head as a pure function, many by vmap.

Shapes are written in every docstring: T_q/T_k query/key lengths, D_k the
query/key width, D_v the value width, B batch, H heads. Masks are boolean with
True = attend; biases are additive.

Numerics: scores, bias and softmax are float32 whatever the input dtype
(float64 inputs, with x64 enabled, stay float64); masked
scores are replaced (`jnp.where`) by a finite large negative, never `-inf`; a
query row with no key to attend gets all-zero weights and a zero output, with
zero (finite) gradients. Optional logit soft-capping (`soft_cap.py`) and
learned sink logits (`sink_logits.py`) act in float32 too.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from attention_jax.attention.checks import as_bool_mask
from attention_jax.attention.checks import check_array
from attention_jax.attention.checks import check_qkv
from attention_jax.attention.heads import check_broadcast
from attention_jax.attention.heads import map_heads
from attention_jax.attention.masks import combine_masks
from attention_jax.attention.masks import structural_mask
from attention_jax.attention.scores import MASK_VALUE
from attention_jax.attention.scores import materialise
from attention_jax.attention.segments import segment_mask
from attention_jax.attention.sink_logits import check_sinks
from attention_jax.attention.soft_cap import check_soft_cap
from attention_jax.attention.soft_cap import soft_cap
from attention_jax.attention.stick_breaking import stick_breaking_attention


def masked_softmax(scores: jnp.ndarray, mask: Optional[jnp.ndarray],
                   sink: Optional[jnp.ndarray] = None) -> jnp.ndarray:
  """Softmax over the last axis of `scores`, restricted to `mask` (True = keep).

  Masked entries get exactly zero weight; a row with nothing kept is all
  zeros (not uniform, not NaN), with zero gradients. Computed in the dtype of
  `scores` (callers pass float32 or wider). With `sink`, a learned logit
  (a scalar, `sink_logits.py`) joins the denominator only: the weights of a
  row sum to less than 1, and a row with nothing kept is all zeros.
  """
  if mask is not None and mask.dtype != jnp.bool_:
    raise TypeError(f'mask must be boolean (True = attend), got {mask.dtype}.')
  if sink is not None:
    kept = scores if mask is None else jnp.where(mask, scores, MASK_VALUE)
    sink = jnp.asarray(sink, scores.dtype)
    # The max only keeps exp() finite; the weights do not depend on it.
    top = jax.lax.stop_gradient(jnp.maximum(kept.max(-1, keepdims=True), sink))
    e = jnp.exp(kept - top)
    if mask is not None:
      e = jnp.where(mask, e, 0.0)
    return e / (e.sum(-1, keepdims=True) + jnp.exp(sink - top))
  if mask is None:
    return jax.nn.softmax(scores, axis=-1)
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
    logit_soft_cap: Optional[float] = None,
    sink: Optional[jnp.ndarray] = None,
) -> tuple[jnp.ndarray, jnp.ndarray]:
  """One head of `softmax(q kᵀ / √D_k + bias) v` (lesson 7.2).

  Args:
    q: queries `[T_q, D_k]`.
    k: keys `[T_k, D_k]`.
    v: values `[T_k, D_v]`.
    mask: optional boolean `[T_q, T_k]` (or broadcastable), True = attend.
    bias: optional additive scores `[T_q, T_k]` (or broadcastable).
    logit_soft_cap: optional c > 0: the scores, bias added, become
      `c · tanh(s / c)` before the mask (`soft_cap.py`).
    sink: optional scalar, this head's learned sink logit, joining the
      softmax's denominator only (`sink_logits.py`).

  Returns:
    `(out, weights)`: out `[T_q, D_v]` in the dtype of `v`; weights
    `[T_q, T_k]` in float32, each row summing to 1 over attended keys (less
    than 1 with a sink; all zeros for a row whose keys are all masked).
  """
  q, k, v = (check_array(n, x, kind='floating') for n, x in (('q', q), ('k', k), ('v', v)))
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
  check_soft_cap(logit_soft_cap)
  mask = as_bool_mask('mask', None if mask is None else check_array('mask', mask))
  bias = None if bias is None else check_array('bias', bias, kind='floating')
  if sink is not None:
    sink = check_array('sink', sink, ndim=0, kind='floating')
  compute_dtype = jnp.promote_types(jnp.result_type(q, k, v), jnp.float32)  # >= f32
  scores = jnp.einsum('qd,kd->qk', q, k, preferred_element_type=compute_dtype)
  scores = scores * (1.0 / (q.shape[1] ** 0.5))
  if bias is not None:
    check_broadcast('bias', bias, scores_shape)
    scores = scores + bias.astype(compute_dtype)
  scores = soft_cap(scores, logit_soft_cap).astype(compute_dtype)
  if mask is not None:
    check_broadcast('mask', mask, scores_shape)
  weights = masked_softmax(scores, mask, sink)
  out = jnp.einsum('qk,kd->qd', weights, v, preferred_element_type=compute_dtype)
  return out.astype(v.dtype), weights


def multi_head_attention(
    q: jnp.ndarray,
    k: jnp.ndarray,
    v: jnp.ndarray,
    *,
    mask: Optional[jnp.ndarray] = None,
    bias: Optional[jnp.ndarray] = None,
    logit_soft_cap: Optional[float] = None,
    sinks: Optional[jnp.ndarray] = None,
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
    logit_soft_cap: optional c > 0 (`dot_product_attention`).
    sinks: optional float `[H]`, one learned sink logit per query head
      (`sink_logits.py`).

  Returns:
    `(out, weights)`: out `[B, T_q, H, D_v]` in the dtype of `v`; weights
    `[B, H, T_q, T_k]` in float32.
  """
  check_soft_cap(logit_soft_cap)
  q, k, v = check_qkv(q, k, v, 'multi_head_attention')
  sinks = check_sinks(sinks, q.shape[2])
  head = functools.partial(dot_product_attention, logit_soft_cap=logit_soft_cap)
  return map_heads(head, q, k, v, mask=mask, bias=bias, name='multi_head_attention',
                   sinks=sinks)


def dense_kernel(q, k, v, *, mask, scores, causal, window, kv_lengths, return_weights,
                 normalization=None, q_slots=None, segment_ids=None, logit_soft_cap=None,
                 sinks=None, **unused_options):
  """The 'dense' row of `dispatch.KERNELS`: structure, segment ids (int32
  (q ids `[B, T_q]`, kv ids `[B, T_k]`) or None) as a mask, and the score
  specs (a tuple, any kind with a dense form) materialised, then
  `multi_head_attention` (softmax, with the soft cap and sink logits if
  given) or `stick_breaking_attention` (normalization a `StickBreaking`).
  Shapes as there; mask rank 4 or None. -> (out, weights or None)."""
  del unused_options  # other kernels' options (chunk sizes)
  t_q, t_k = q.shape[1], k.shape[1]
  mask = combine_masks(mask, structural_mask(t_q, t_k, causal=causal, window=window,
                                             kv_lengths=kv_lengths),
                       None if segment_ids is None else segment_mask(*segment_ids))
  bias = materialise(scores, t_q, t_k)
  if normalization is None:
    out, weights = multi_head_attention(q, k, v, mask=mask, bias=bias,
                                        logit_soft_cap=logit_soft_cap, sinks=sinks)
  elif logit_soft_cap is not None or sinks is not None:
    raise ValueError('dense_kernel: logit_soft_cap and sinks act on a softmax only.')
  else:
    out, weights = stick_breaking_attention(
        q, k, v, mask=mask, bias=bias, q_slots=q_slots,
        attend_current=normalization.attend_current, remainder=normalization.remainder,
        return_weights=True)
  return out, (weights if return_weights else None)
