"""The math of one (query block, key block) pair, shared by both strategies of
`chunked_attention` (`blockwise_scan.py`, `blockwise_unrolled.py`).

All arrays hold G rows, one row per (example, head): q_blk `[G, qc, D]`,
k_blk / v_blk `[G, kc, D]`, kv_len `[G]` (keys at or past it are padding),
slopes `[G]` or None (ALiBi), and a difference bias's values qv_blk `[G, qc]`
and kv_blk `[G, kc]` or None (`q_values[i] - k_values[j]`, forgetting
attention), and segment ids qs_blk int32 `[G, qc]` and ks_blk `[G, kc]` or
None (query i keeps key j only where they are equal). Block starts are the blocks' first query and key
indices, Python ints or traced scalars. Arithmetic in float32.
"""

import jax.numpy as jnp

from attention_jax.attention.scores import linear_bias
from attention_jax.attention.scores import relative_distance
from attention_jax.attention.soft_cap import soft_cap
from attention_jax.attention.soft_cap import soft_cap_slope


def block_scores(q_blk, k_blk, q_start, k_start, kv_len, slopes, qv_blk=None, kv_blk=None,
                 qs_blk=None, ks_blk=None, *, scale, causal, t_k, window, keys_first=False,
                 cap=None):
  """Scores and keep-mask of one block pair, soft-capped by `cap` (None: not)
  after the biases.

  Returns scores float32 and keep bool, both `[G, qc, kc]`, or `[G, kc, qc]`
  when `keys_first` (the backward's orientation, see `backward_block`). Keys
  at `t_k` or past it (the blocks' own padding) are never kept.
  """
  q_idx = q_start + jnp.arange(q_blk.shape[1])
  k_idx = k_start + jnp.arange(k_blk.shape[1])
  if keys_first:
    s = jnp.einsum('gkd,gqd->gkq', k_blk, q_blk, preferred_element_type=jnp.float32)
    distance = -relative_distance(k_idx, q_idx)  # i - j, [kc, qc]
    key_index = k_idx[:, None]
  else:
    s = jnp.einsum('gqd,gkd->gqk', q_blk, k_blk, preferred_element_type=jnp.float32)
    distance = relative_distance(q_idx, k_idx)  # i - j, [qc, kc]
    key_index = k_idx[None, :]
  s = s * scale
  if slopes is not None:
    s = s + linear_bias(slopes, distance)
  if qv_blk is not None:
    if keys_first:
      s = s + (qv_blk[:, None, :] - kv_blk[:, :, None])
    else:
      s = s + (qv_blk[:, :, None] - kv_blk[:, None, :])
  s = soft_cap(s, cap)
  keep = key_index[None] < jnp.minimum(kv_len, t_k)[:, None, None]
  if causal:
    keep = keep & (distance >= 0)[None]
  if window is not None:
    keep = keep & (jnp.abs(distance) < window)[None]
  if qs_blk is not None:
    keep = keep & (ks_blk[:, :, None] == qs_blk[:, None, :] if keys_first
                   else qs_blk[:, :, None] == ks_blk[:, None, :])
  return s, keep


def normalise(m, l, acc):
  """Output and row log-sum-exp from the row max `m`, normaliser `l` `[G, qc]`
  and unnormalised output `acc` `[G, qc, Dv]`. A row with no key to attend
  (l == 0) gets a zero output and lse = +inf, so that the backward's
  exp(s - lse) is 0 there: zero gradients, no NaN. A NaN normaliser (a NaN
  score) is not such a row: it stays NaN, as the dense kernel's would."""
  empty = l == 0
  safe_l = jnp.where(empty, 1.0, l)
  out = jnp.where(empty[..., None], 0.0, acc / safe_l[..., None])
  lse = jnp.where(empty, jnp.inf, m + jnp.log(safe_l))
  return out, lse


def backward_block(q_blk, do_blk, lse_blk, delta_blk, k_blk, v_blk, k_t_blk, q_start,
                   k_start, kv_len, slopes, qv_blk=None, kv_blk=None, qs_blk=None,
                   ks_blk=None, *, scale, causal, t_k, window, cap=None):
  """FlashAttention's gradient contributions of one block pair, recomputing
  its probabilities from the row log-sum-exp.

  Worked keys-first (Sᵀ, Pᵀ, dSᵀ are `[G, kc, qc]`) with dQ transposed, from a
  transposed key block k_t_blk `[G, D, kc]`, so that no matmul contracts over
  the middle axes of both operands: dV = Pᵀ dO and dK = dSᵀ Q written
  queries-first do, and XLA:CPU runs that layout at about half speed.

  Args: do_blk `[G, qc, Dv]` (float32); lse_blk and delta_blk (rowsum(dO ∘ O))
    `[G, 1, qc]`; the rest as in `block_scores`.
  Returns: dq_t `[G, D, qc]`, dk `[G, kc, D]`, dv `[G, kc, Dv]`, and with a
  difference bias d q_values `[G, qc]` and d k_values `[G, kc]` (else None),
  float32. The bias gradient is dS itself (the bias is added after the
  scale), times the soft cap's slope 1 - tanh² with a `cap`: its row sums
  for the query values, minus its column sums for the key values.
  """
  s_t, keep = block_scores(q_blk, k_blk, q_start, k_start, kv_len, slopes, qv_blk, kv_blk,
                           qs_blk, ks_blk, scale=scale, causal=causal, t_k=t_k, window=window,
                           keys_first=True, cap=cap)
  p_t = jnp.where(keep, jnp.exp(s_t - lse_blk), 0.0)
  dv = jnp.einsum('gkq,gqd->gkd', p_t, do_blk)
  dp_t = jnp.einsum('gkd,gqd->gkq', v_blk, do_blk, preferred_element_type=jnp.float32)
  dbias_t = p_t * (dp_t - delta_blk)
  if cap is not None:
    dbias_t = dbias_t * soft_cap_slope(s_t, keep, cap)
  ds_t = dbias_t * scale
  dq_t = jnp.einsum('gdk,gkq->gdq', k_t_blk, ds_t, preferred_element_type=jnp.float32)
  dk = jnp.einsum('gkq,gqd->gkd', ds_t, q_blk, preferred_element_type=jnp.float32)
  if qv_blk is None:
    return dq_t, dk, dv, None, None
  return dq_t, dk, dv, dbias_t.sum(1), -dbias_t.sum(2)


def pad_to(x, axis, multiple):
  """Zeros appended to `axis` of x up to a multiple of `multiple`."""
  pad = -x.shape[axis] % multiple
  if not pad:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)


def difference_rows(difference, b, h, t_q, t_k):
  """(q_values `[B|1, T_q, H]`, k_values `[B|1, T_k, H]`) -> float32 rows
  `[B · H, T_q]`, `[B · H, T_k]`, one per (example, head) like q's rows."""
  q_values, k_values = (jnp.asarray(x, jnp.float32) for x in difference)
  if q_values.shape[1:] != (t_q, h) or k_values.shape[1:] != (t_k, h):
    raise ValueError(f'difference bias values {q_values.shape} and {k_values.shape} for '
                     f'H={h}, T_q={t_q}, T_k={t_k}: need [B|1, T_q, H] and [B|1, T_k, H].')
  q_values, k_values = jnp.moveaxis(q_values, -1, 1), jnp.moveaxis(k_values, -1, 1)
  rows = lambda x, t: jnp.broadcast_to(x, (b, h, t)).reshape(b * h, t)
  return rows(q_values, t_q), rows(k_values, t_k)
