"""Key/value caches: `MultiHeadAttention`'s cached decoding and the slot check.

A write past the cache's end is an error, but `dynamic_update_slice` would
silently shift it. Where `start` is known while tracing (a Python or NumPy
int, or a concrete array outside jit) `extend` raises a ValueError at once.
Where it is traced (under `jit`, `nnx.jit`, `scan`) there is no exception to
raise: the call records the first bad range in the cache's `overflow` entry
(int32 `[2]`: start, end; `(0, 0)` while every write was in range) and
returns NaN outputs, so no number computed from a shifted cache looks valid.
`check_cache` then raises the same ValueError, word for word, as the eager
call would have: on the returned cache, or on a module whose stateful cache
(`decode=True`) a jitted step updated.

This replaces a host callback (`jax.debug.callback`) that raised on the
host: under jit that surfaces as an INTERNAL runtime error after a logged
traceback, and it costs a device-host round trip per step and layer.
"""

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention import scaled_dot_product_attention
from attention_jax.attention.checks import is_concrete
from attention_jax.attention.segments import check_segment_ids
from attention_jax.attention.segments import segment_mask
from attention_jax.attention.segments import segment_positions
from attention_jax.attention.scalable import scalable_softmax_queries
from attention_jax.attention.scalable import visible_keys
from attention_jax.positional.base import ScoreContext

NO_OVERFLOW = (0, 0)
CACHE_NAMES = ('key', 'value', 'positions', 'features', 'query', 'overflow')


def past_cache_message(start: int, end: int, t_max: int) -> str:
  """The one wording of the error, eager or read back from `overflow`."""
  return (f'extend writes cache slots {start} … {end - 1} but the cache has {t_max} '
          f'slots (0 … {t_max - 1}); make it longer with init_cache(cache_size=...).')


is_static = is_concrete  # whether a start slot has a value now (not a tracer)


def check_cache_slots(start, s_len: int, t_max: int) -> None:
  """ValueError if a known `start` puts slots start … start+s_len-1 outside
  0 … t_max-1; nothing for a traced one (see `guard_slots`)."""
  if is_static(start):
    start = int(start)
    if start < 0 or start + s_len > t_max:
      raise ValueError(past_cache_message(start, start + s_len, t_max))


def empty_overflow() -> jax.Array:
  return jnp.array(NO_OVERFLOW, jnp.int32)


def cached_documents(cache: dict, segment_ids, start, s_len: int, b: int):
  """The documents of a call over a cache of packed documents, or None.

  A cache holds packed documents once a call gave `segment_ids` (int
  `[B, S]`, the call's tokens' documents): it then keeps every slot's id
  (`cache['segment_ids']`, int32 `[B, T]`; earlier slots without ids are
  document 0). A later call without ids continues the document of the slot
  before it (0 at slot 0). Returns None for a cache and call without ids
  (one document per row, as before), else (the cache's ids with the call's
  written, the call's ids `[B, S]`, the call's positions in their
  documents `[B, S]`: each token's index in its run of equal ids, as
  `segment_positions` gives the full pass)."""
  if segment_ids is None and 'segment_ids' not in cache:
    return None
  t_max = cache['key'].shape[2]
  ids = cache.get('segment_ids', jnp.zeros((b, t_max), jnp.int32))
  if segment_ids is None:
    before = jax.lax.dynamic_index_in_dim(ids, jnp.maximum(jnp.asarray(start) - 1, 0), 1,
                                          False)
    call_ids = jnp.broadcast_to(jnp.where(jnp.asarray(start) > 0, before, 0)[:, None], (b, s_len))
  else:
    call_ids, _ = check_segment_ids(segment_ids, None, b, s_len, s_len)
  ids = jax.lax.dynamic_update_slice_in_dim(ids, call_ids, start, 1)
  slots = start + jnp.arange(s_len, dtype=jnp.int32)
  positions = jnp.take(segment_positions(ids), slots, axis=1)
  return ids, call_ids, positions


def guard_slots(start, s_len: int, t_max: int) -> tuple[Any, Any]:
  """(in_range, record): `in_range` a bool scalar (True for a static start,
  already checked), `record(overflow)` the cache's new `overflow` entry."""
  check_cache_slots(start, s_len, t_max)
  if is_static(start):
    return True, lambda overflow: overflow
  start = jnp.asarray(start, jnp.int32)
  in_range = (start >= 0) & (start + s_len <= t_max)

  def record(overflow):
    first = jnp.all(overflow == 0) & ~in_range  # keep the first bad write
    return jnp.where(first, jnp.stack([start, start + s_len]), overflow)

  return in_range, record


def poison(out: jax.Array, in_range) -> jax.Array:
  """NaN outputs for an out-of-range write; `out` itself when in range."""
  if in_range is True:
    return out
  return jnp.where(in_range, out, jnp.asarray(jnp.nan, out.dtype))


def check_cache(cache) -> None:
  """Raises the ValueError an eager `extend` would have raised if any write
  into `cache` went outside its slots under jit. Call it on what a jitted
  step returned or updated.

  `cache`: one layer's dict from `init_cache(batch_size, cache_size)`, a
  model's list of them, or a module (a `MultiHeadAttention`, or any model
  holding some) whose stateful caches `init_cache(input_shape)` set up for
  `decode=True`: every one of its attention modules' caches is checked."""
  if isinstance(cache, nnx.Module):
    cache = stateful_caches(cache)
  layers = cache if isinstance(cache, (list, tuple)) else [cache]
  for layer in layers:
    if not isinstance(layer, dict) or 'key' not in layer:
      raise TypeError('check_cache takes a cache from init_cache (a dict with "key", '
                      f'"value", …, or a list of them) or a module, got {type(layer).__name__}.')
    if 'overflow' not in layer:
      continue
    start, end = (int(v) for v in np.asarray(layer['overflow']))
    if (start, end) != NO_OVERFLOW:
      raise ValueError(past_cache_message(start, end, layer['key'].shape[2]))


def stateful_caches(module: nnx.Module) -> list[dict]:
  """The caches kept in `module` and its submodules (`init_cache(input_shape)`,
  Flax's stateful decoding), as dicts like `init_cache`'s; ValueError if none."""
  caches = [{name: getattr(node, f'cached_{name}')[...] for name in CACHE_NAMES
             if getattr(node, f'cached_{name}') is not None}
            for _, node in nnx.iter_graph(module)
            if isinstance(node, KVCache) and node.cached_key is not None]
  if not caches:
    raise ValueError(f'check_cache({type(module).__name__}) found no stateful cache in the '
                     'module: call init_cache((batch, cache_size, d_model)) on its attention '
                     'first, or pass the cache dict that init_cache(batch_size, cache_size) '
                     'returned.')
  return caches


class KVCache:
  """`MultiHeadAttention`'s cached decoding: `init_cache`, `extend` and
  Flax's stateful `decode=True`. Reads the module's projections, encoding,
  window and normalization."""

  def init_cache(self, batch_size, cache_size: Optional[int] = None,
                 dtype=jnp.float32) -> Optional[dict]:
    """An empty key/value cache, returned or (Flax's way) kept in the module.

    `init_cache(batch_size, cache_size)` returns the cache for `extend`:
    key/value `[B, H_kv, cache_size, D]` (rotated keys when the encoding
    rotates), their int32 positions `[B, cache_size]`, for an encoding with
    `token_features` the keys' features float32 `[B, cache_size, F]`, for one
    that `reads_query_history` the queries `[B, H, cache_size, D]`, and
    `overflow` int32 `[2]` (see `nn.cache`).

    `init_cache(input_shape)`, Flax's form, `input_shape = (B, cache_size,
    …)`: the same cache stored in the module (`cached_key`, …,
    `cache_index`), returning None, for calls with `decode=True`.

    Heads before slots: the layout the score and output contractions read,
    so a decoding step does not transpose the whole cache."""
    if isinstance(batch_size, (tuple, list)):
      if cache_size is not None or len(batch_size) < 2:
        raise ValueError(f'init_cache(input_shape) takes (batch, cache_size, ...), got '
                         f'{batch_size!r} and cache_size={cache_size!r}.')
      self._store(self.init_cache(batch_size[0], batch_size[1], dtype))
      self.cache_index = nnx.Cache(jnp.array(0, jnp.int32))
      return None
    if cache_size is None:
      raise ValueError('init_cache needs (batch_size, cache_size), or Flax\'s input_shape '
                       f'tuple; got batch_size={batch_size!r} alone.')
    shape = (batch_size, self.num_kv_heads, cache_size, self.head_dim)
    cache = dict(key=jnp.zeros(shape, dtype), value=jnp.zeros(shape, dtype),
                 positions=jnp.zeros((batch_size, cache_size), jnp.int32),
                 overflow=empty_overflow())
    features = jax.eval_shape(self.positional.token_features, jax.ShapeDtypeStruct(
        (batch_size, cache_size, self.d_model), jnp.float32))
    if features is not None:
      cache['features'] = jnp.zeros(features.shape, jnp.float32)
    if self.positional.reads_query_history:  # Multi-Token Attention's earlier queries
      cache['query'] = jnp.zeros((batch_size, self.num_heads, cache_size, self.head_dim), dtype)
    return cache

  def _store(self, cache: dict) -> None:
    for name in CACHE_NAMES:
      if name in cache:
        setattr(self, f'cached_{name}', nnx.Cache(cache[name]))

  def _decode(self, x, context, positions, mask, bias, kv_lengths, weighted):
    if self.cache_index is None:
      raise ValueError('decode=True reads the cache kept in the module: call '
                       'init_cache((batch, cache_size, d_model)) first.')
    if context is not None or mask is not None or bias is not None or kv_lengths is not None \
        or weighted:
      raise ValueError('decode=True is causal self-attention over the cache: it takes no '
                       'context, mask, bias, kv_lengths, return_weights or sow_weights.')
    cache = {name: getattr(self, f'cached_{name}')[...] for name in CACHE_NAMES
             if getattr(self, f'cached_{name}') is not None}
    out, cache = self.extend(x, cache, self.cache_index[...], positions=positions)
    for name, value in cache.items():
      getattr(self, f'cached_{name}')[...] = value
    self.cache_index[...] += x.shape[1]
    return out

  def extend(self, x: jnp.ndarray, cache: dict, start, *,
             positions: Optional[jnp.ndarray] = None,
             segment_ids: Optional[jnp.ndarray] = None) -> tuple[jnp.ndarray, dict]:
    """Causal self-attention of S new tokens over themselves and the cache.

    The tokens take cache slots `start … start+S-1` (`start` may be traced);
    each attends to slots at or before its own (and inside the sliding
    window). Prefill is one call with S = prompt length, decoding one call
    per token with S = 1; either way the outputs equal the full causal pass.
    Never drops (dropout is for training passes).

    Slots outside the cache: a ValueError for a known `start`; for a traced
    one, NaN outputs and the range recorded in `cache['overflow']`, which
    `aj.nn.check_cache(cache)` turns into the same ValueError.

    Args:
      x: `[B, S, d_model]`.
      cache: from `init_cache` or a previous `extend`.
      start: first slot written, an int or int32 scalar.
      positions: int `[S]` or `[B, S]` for the encoding; default the slots,
        or with packed documents each token's index in its document.
      segment_ids: int `[B, S]`, the documents of a packed prompt (a row of
        several, each attending only to itself, as the full pass's
        `segment_ids`); the cache then keeps every slot's document, and a
        later call without ids continues the document of the slot before it
        (`cached_documents`).

    Returns:
      `(out [B, S, out_features], cache)` with the new keys, values and
      positions.
    """
    in_range, record = guard_slots(start, x.shape[1], cache['key'].shape[2])
    out, cache = self._extend(x, cache, start, positions=positions, segment_ids=segment_ids)
    if 'overflow' in cache:
      cache = dict(cache, overflow=record(cache['overflow']))
    return poison(out, in_range), cache

  def _extend(self, x, cache, start, *, positions=None, segment_ids=None):
    """`extend` without the slot check, for callers that guarantee the range."""
    if not self.causal:
      raise ValueError('extend (cached decoding) is causal attention, but this module '
                       'has causal=False.')
    (b, s_len, _), t_max = x.shape, cache['key'].shape[2]
    # A call that fills every slot starts at slot 0 (from any other start it
    # overflows, and its output is poisoned): its slots are then static, so an
    # encoding takes its full-pass form (PaTH: the dense logits, its blocks
    # shared by all queries, not a block per query; O(T²), not O(T² · C)).
    slots = (np.arange(s_len, dtype=np.int32) if s_len == t_max
             else start + jnp.arange(s_len, dtype=jnp.int32))
    documents = cached_documents(cache, segment_ids, start, s_len, b)
    if documents is not None and self.ssmax_scale is not None:
      raise ValueError('segment_ids= with scalable_softmax: its log n counts the keys a '
                       'query sees by index, across documents; packed rows are not '
                       'served with it, in a full pass or over a cache.')
    if positions is None:
      positions = slots if documents is None else documents[2]
    positions = jnp.broadcast_to(jnp.asarray(positions, jnp.int32), (b, s_len))
    q, k, v = self.W_Q(x), self.W_K(x), self.W_V(x)
    q, k = self.positional.rotate_queries_keys(q, k, positions, positions)
    if self.ssmax_scale is not None:  # slot i sees slots 0 … i (and the window)
      n = visible_keys(slots, t_max, causal=True, window=self.sliding_window)
      q = scalable_softmax_queries(q, self.ssmax_scale[...], n)
    write = lambda buf, new, axis: jax.lax.dynamic_update_slice_in_dim(
        buf, new.astype(buf.dtype), start, axis=axis)
    heads_first = lambda a: jnp.swapaxes(a, 1, 2)  # [B, S, H, D] <-> [B, H, S, D]
    features = self.positional.token_features(x)
    cache = dict(cache, key=write(cache['key'], heads_first(k), 2),
                 value=write(cache['value'], heads_first(v), 2),
                 positions=write(cache['positions'], positions, 1))
    if features is not None:
      cache['features'] = write(cache['features'], features, 1)
    if 'query' in cache:
      cache['query'] = write(cache['query'], heads_first(q), 2)
    keys = jnp.arange(t_max)[None, :]
    mask = keys <= slots[:, None]  # causal; also hides the slots not yet written
    if self.sliding_window is not None:
      mask = mask & (slots[:, None] - keys < self.sliding_window)
    q_ids = k_ids = None
    if documents is not None:  # each token sees its own document only
      k_ids, q_ids, _ = documents
      cache['segment_ids'] = k_ids
      mask = mask[None, None] & segment_mask(q_ids, k_ids)
    all_keys = heads_first(cache['key']).astype(q.dtype)
    score_bias = self.positional.score_contribution(ScoreContext(
        q=q, k=all_keys, q_positions=positions, k_positions=cache['positions'],
        q_slots=slots, q_features=features, k_features=cache.get('features'), causal=True,
        window=self.sliding_window, q_segment_ids=q_ids, k_segment_ids=k_ids,
        q_history=heads_first(cache['query']).astype(q.dtype) if 'query' in cache else None))
    # The mask moves with `start`, which blocks do not express; the queries
    # are one token (or a prompt), cheap on the other kernels.
    implementation = ('auto' if self.implementation in ('chunked', 'path_blockwise')
                      else self.implementation)
    values = heads_first(cache['value']).astype(v.dtype)
    if self.remainder is not None:  # stick-breaking's 'head_bias' (nn.stick_breaking)
      values = self.remainder.values(values)
    out = scaled_dot_product_attention(
        q, all_keys, values, mask=mask,
        score_bias=score_bias, normalization=self.normalization, q_slots=slots,
        implementation=implementation, **self._logit_options())
    return self.W_O(self._with_remainder(out)), cache
