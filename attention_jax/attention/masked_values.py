"""Keys masked by structure have no influence, even with NaN or ±inf values.

A kernel's output is `Σ_j w_ij v_j` with w_ij = 0 for a masked key, but
0 · NaN = NaN and 0 · inf = NaN: a non-finite value in a padded row of v
(garbage past `kv_lengths`) or in a future row (under `causal`) would turn
the real outputs NaN, and their gradients too. So the dispatcher hands every
kernel v with its non-finite entries zeroed (`finite_values`) and puts NaN
back (`restore_non_finite`) exactly where a query can see one: feature d of
query i is NaN when some key j visible to i by structure (causal, `window`,
`kv_lengths`) has a non-finite v_j[d]; every other output, and every
gradient, is that of the same call with the hidden values replaced by
anything finite.

Visibility by structure is a range of keys per query, [lo_i, hi_i], so
which outputs see a non-finite value is a difference of prefix counts:
O(B · T · H · D) work, no T_q × T_k array. A dense `mask` or `segment_ids`
only narrows what is visible inside that range: a key they alone mask, with
a non-finite value, still makes NaN the outputs of the queries whose range
holds it (as 0 · NaN would).

Shapes: v `[B, T_k, H_kv, D_v]`, out `[B, T_q, H, D_v]`.
"""

from typing import Optional

import jax
import jax.numpy as jnp


def masks_by_structure(causal: bool, window: Optional[int], kv_lengths) -> bool:
  """Whether a call masks keys by structure (what this module guards)."""
  return causal or window is not None or kv_lengths is not None


def finite_values(v: jnp.ndarray):
  """(v with its non-finite entries zeroed, bad `[B, T_k, H_kv, D_v]` bool:
  where they were). The gradient reaches only the finite entries."""
  bad = ~jnp.isfinite(v)
  return jnp.where(bad, jnp.zeros((), v.dtype), v), bad


def visible_range(t_q: int, t_k: int, *, causal: bool, window: Optional[int], kv_lengths):
  """Each query's visible keys by structure, [lo, hi] inclusive, int32
  `[B|1, T_q]` each (hi < lo: none)."""
  i = jnp.arange(t_q, dtype=jnp.int32)[None]
  lo = jnp.zeros_like(i)
  hi = jnp.full_like(i, t_k - 1)
  if causal:
    hi = jnp.minimum(hi, i)
  if window is not None:
    lo = jnp.maximum(lo, i - window + 1)
    hi = jnp.minimum(hi, i + window - 1)
  if kv_lengths is not None:
    hi = jnp.minimum(hi, jnp.asarray(kv_lengths, jnp.int32)[:, None] - 1)
  return lo, hi


def restore_non_finite(out: jnp.ndarray, bad: jnp.ndarray, *, causal: bool,
                       window: Optional[int], kv_lengths) -> jnp.ndarray:
  """`out` `[B, T_q, H, D_v]` with NaN where a query sees, by structure, a key
  whose value was non-finite (`bad` from `finite_values`). The prefix counts
  run only when some value was non-finite: the common call pays one `any`."""
  restore = lambda out: _restore(out, bad, causal=causal, window=window, kv_lengths=kv_lengths)
  return jax.lax.cond(jnp.any(bad), restore, lambda out: out, out)


def _restore(out, bad, *, causal, window, kv_lengths):
  b, t_q, h, _ = out.shape
  t_k, h_kv = bad.shape[1], bad.shape[2]
  # counts[:, j + 1] = number of bad keys among 0 … j, per head and feature.
  counts = jnp.cumsum(bad.astype(jnp.int32), axis=1)
  counts = jnp.concatenate([jnp.zeros_like(counts[:, :1]), counts], axis=1)
  lo, hi = visible_range(t_q, t_k, causal=causal, window=window, kv_lengths=kv_lengths)
  lo, hi = jnp.broadcast_to(lo, (b, t_q)), jnp.broadcast_to(hi, (b, t_q))
  take = lambda index: jnp.take_along_axis(
      counts, jnp.clip(index, 0, t_k)[:, :, None, None], axis=1)
  seen = jnp.where((hi >= lo)[:, :, None, None], take(hi + 1) - take(lo), 0) > 0
  if h_kv != h:  # query head g reads key/value head g // (H / H_kv)
    seen = jnp.repeat(seen, h // h_kv, axis=2)
  return jnp.where(seen, jnp.asarray(jnp.nan, out.dtype), out)
