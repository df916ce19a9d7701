"""Heads as an axis: a single-head attention function vmapped over heads and
batch, and the shape rules every multi-head path shares (rank-4 masks and
biases, broadcasting, grouped-query key/value heads)."""

from typing import Optional

import jax
import jax.numpy as jnp

from attention_jax.attention.checks import as_bool_mask
from attention_jax.attention.checks import check_array
from attention_jax.attention.checks import check_qkv


def check_broadcast(name: str, x: jnp.ndarray, target: tuple[int, ...]) -> None:
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


def map_heads(head_fn, q, k, v, *, mask=None, bias=None, name='map_heads', sinks=None):
  """`head_fn(q [T_q, D], k [T_k, D], v [T_k, D_v], mask=, bias=) -> (out
  [T_q, D_v], weights [T_q, T_k])` vmapped over heads and batch, with the
  shapes, broadcasting and grouped-query rules of `multi_head_attention`.
  The one place heads become an axis: softmax and stick-breaking attention
  share it. With `sinks` `[H]`, head h's call also gets `sink=sinks[h]`."""
  q, k, v = check_qkv(q, k, v, name)
  (b, t_q, h, _), t_k = q.shape, k.shape[1]
  k, v = repeat_kv_heads(k, v, h, q.shape)
  full = (b, h, t_q, t_k)
  mask = as_bool_mask('mask', None if mask is None else check_array('mask', mask))
  bias = None if bias is None else check_array('bias', bias, kind='floating')
  mask, bias = as_rank4('mask', mask), as_rank4('bias', bias)
  if mask is not None:
    check_broadcast('mask', mask, full)
  if bias is not None:
    check_broadcast('bias', bias, full)

  # The batch axis is 0 of mask/bias; once vmapped away, the head axis is 0.
  mask, mask_b = _vmap_plan(mask, 0, b)
  bias, bias_b = _vmap_plan(bias, 0, b)

  sink = {} if sinks is None else {'sink': sinks}

  def one_example(q, k, v, mask, bias, sink):
    mask, mask_h = _vmap_plan(mask, 0, h)
    bias, bias_h = _vmap_plan(bias, 0, h)
    per_head = jax.vmap(
        lambda q, k, v, m, b, s: head_fn(q, k, v, mask=m, bias=b, **s),
        in_axes=(1, 1, 1, mask_h, bias_h, 0), out_axes=(1, 0))
    return per_head(q, k, v, mask, bias, sink)

  return jax.vmap(one_example, in_axes=(0, 0, 0, mask_b, bias_b, None))(
      q, k, v, mask, bias, sink)
