"""Blockwise attention with an online softmax: no T_q × T_k matrix in memory.

The algorithm of Rabe & Staats (2021) and FlashAttention (Dao et al. 2022) in
pure JAX. Queries are processed in blocks of `q_chunk`; for each, a loop over
key blocks of `k_chunk` keeps a running row maximum `m`, normaliser `l` and
unnormalised output `acc`. Memory is O(T · chunk) instead of O(T²).

The backward pass is a `jax.custom_vjp` that stores only the output and the
row log-sum-exp and recomputes each block's probabilities, as FlashAttention
does; differentiating through the loops instead would store every block.

Masks and biases are given by structure, not as T × T arrays, so that they too
are built per block: `causal`, per-example `kv_lengths` (key padding) and
per-head `alibi_slopes` (ALiBi's `-slope · (i - j)`) and a sliding `window`
(`|i - j| < window`). Key blocks entirely above the causal diagonal or outside
the window are skipped, so windowed attention costs O(T · window). Arbitrary dense masks and biases belong to
`dense.py`.

Shapes: q `[B, T_q, H, D]`, k `[B, T_k, H, D]`, v `[B, T_k, H, D_v]`;
out `[B, T_q, H, D_v]` in the dtype of v. Arithmetic in float32. Inside, the
arrays are laid out as rows `[B · H, T, D]` (one per example and head) and
walked `heads_per_step` rows at a time, so a block's scores are
`[heads_per_step, q_chunk, k_chunk]` whatever the batch size.
"""

import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp

from attention_jax.attention.dense import MASK_VALUE
from attention_jax.attention.dense import repeat_kv_heads


def _pad_to(x, axis, multiple):
  pad = -x.shape[axis] % multiple
  if not pad:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)


def _block_scores(q_blk, k_blk, q_start, k_start, kv_len, slopes, *, scale, causal,
                  t_k, window, keys_first=False):
  """Scores and keep-mask of one (query block, key block) pair for G rows.

  q_blk `[G, qc, D]`, k_blk `[G, kc, D]`, kv_len `[G]`, slopes `[G]` or None
  -> scores float32 and keep bool, both `[G, qc, kc]`, or `[G, kc, qc]` when
  `keys_first` (the backward's orientation, see `_backward_group`).
  """
  qc, kc = q_blk.shape[1], k_blk.shape[1]
  if keys_first:
    s = jnp.einsum('gkd,gqd->gkq', k_blk, q_blk, preferred_element_type=jnp.float32)
    q_idx = q_start + jnp.arange(qc)[None, None, :]
    k_idx = k_start + jnp.arange(kc)[None, :, None]
  else:
    s = jnp.einsum('gqd,gkd->gqk', q_blk, k_blk, preferred_element_type=jnp.float32)
    q_idx = q_start + jnp.arange(qc)[None, :, None]
    k_idx = k_start + jnp.arange(kc)[None, None, :]
  s = s * scale
  if slopes is not None:
    s = s - slopes[:, None, None] * (q_idx - k_idx).astype(jnp.float32)
  keep = k_idx < jnp.minimum(kv_len, t_k)[:, None, None]  # padding, and the blocks' own
  if causal:
    keep = keep & (k_idx <= q_idx)
  if window is not None:
    keep = keep & (jnp.abs(q_idx - k_idx) < window)
  return s, keep


def _key_block_range(q_start, qc, kc, num_k_blocks, causal, window):
  """[first, stop) key blocks a query block needs: those holding a key at or
  below the causal diagonal and inside the window of some query of the block."""
  last_key = q_start + qc - 1 if causal else num_k_blocks * kc - 1
  first_key = 0
  if window is not None:
    first_key = jnp.maximum(0, q_start - window + 1)
    last_key = jnp.minimum(last_key, q_start + qc - 1 + window - 1)
  return first_key // kc, jnp.minimum(num_k_blocks, last_key // kc + 1)


def _forward_group(q, k, v, kv_len, slopes, *, causal, q_chunk, k_chunk, t_k, window):
  """G rows (one row = one example's head): q `[G, Tq', D]` (padded to q_chunk),
  k/v padded to k_chunk. Returns out `[G, Tq', Dv]` float32 and lse `[G, Tq']`."""
  scale = 1.0 / math.sqrt(q.shape[-1])
  num_k_blocks = k.shape[1] // k_chunk
  g, dv = q.shape[0], v.shape[-1]
  scores = functools.partial(_block_scores, scale=scale, causal=causal, t_k=t_k,
                             window=window)

  def one_q_block(q_start):
    q_blk = jax.lax.dynamic_slice_in_dim(q, q_start, q_chunk, axis=1)

    def body(j, carry):
      m, l, acc = carry
      k_blk = jax.lax.dynamic_slice_in_dim(k, j * k_chunk, k_chunk, axis=1)
      v_blk = jax.lax.dynamic_slice_in_dim(v, j * k_chunk, k_chunk, axis=1)
      s, keep = scores(q_blk, k_blk, q_start, j * k_chunk, kv_len, slopes)
      s = jnp.where(keep, s, MASK_VALUE)
      m_new = jnp.maximum(m, s.max(-1))
      p = jnp.where(keep, jnp.exp(s - m_new[..., None]), 0.0)
      correction = jnp.exp(m - m_new)
      l = l * correction + p.sum(-1)
      acc = acc * correction[..., None] + jnp.einsum(
          'gqk,gkd->gqd', p, v_blk, preferred_element_type=jnp.float32)
      return m_new, l, acc

    init = (jnp.full((g, q_chunk), MASK_VALUE, jnp.float32),
            jnp.zeros((g, q_chunk), jnp.float32),
            jnp.zeros((g, q_chunk, dv), jnp.float32))
    first, stop = _key_block_range(q_start, q_chunk, k_chunk, num_k_blocks, causal,
                                   window)
    m, l, acc = jax.lax.fori_loop(first, stop, body, init)
    safe_l = jnp.where(l > 0, l, 1.0)  # l == 0: no key to attend -> zero output
    out = jnp.where((l > 0)[..., None], acc / safe_l[..., None], 0.0)
    lse = jnp.where(l > 0, m + jnp.log(safe_l), jnp.inf)  # exp(s - inf) = 0 below
    return out, lse

  out, lse = jax.lax.map(one_q_block, jnp.arange(0, q.shape[1], q_chunk))
  # [nq, G, qc, Dv], [nq, G, qc] -> [G, Tq', Dv], [G, Tq']
  return (jnp.swapaxes(out, 0, 1).reshape(g, -1, dv),
          jnp.swapaxes(lse, 0, 1).reshape(g, -1))


def _backward_group(q, k, v, kv_len, slopes, out, lse, dout, *, causal, q_chunk,
                    k_chunk, t_k, window):
  """FlashAttention's backward for G rows, recomputing each block.

  Every block is worked on keys-first (`[G, kc, qc]`, i.e. Sᵀ, Pᵀ, dSᵀ) and dQ
  is accumulated transposed (`[G, D, qc]`, from a transposed copy of K), so
  that all five matmuls contract over the last axis of one operand and the
  middle axis of the other, or the last axes of both: the layouts XLA:CPU's
  matmul runs fastest. Contracting over the middle axes of both (what
  dV = Pᵀ dO and dK = dSᵀ Q need in queries-first form) runs at half the
  speed on this CPU.
  """
  scale = 1.0 / math.sqrt(q.shape[-1])
  num_k_blocks = k.shape[1] // k_chunk
  delta = jnp.einsum('gqd,gqd->gq', dout, out)  # rowsum(dO ∘ O), [G, Tq']
  k_t = jnp.swapaxes(k, 1, 2)  # [G, D, Tk']
  scores = functools.partial(_block_scores, scale=scale, causal=causal, t_k=t_k,
                             window=window, keys_first=True)

  def one_q_block(carry, q_start):
    dk, dv = carry
    q_blk = jax.lax.dynamic_slice_in_dim(q, q_start, q_chunk, axis=1)
    do_blk = jax.lax.dynamic_slice_in_dim(dout, q_start, q_chunk, axis=1)
    lse_blk = jax.lax.dynamic_slice_in_dim(lse, q_start, q_chunk, axis=1)[:, None, :]
    delta_blk = jax.lax.dynamic_slice_in_dim(delta, q_start, q_chunk, axis=1)[:, None, :]

    def body(j, inner):
      dq_t, dk, dv = inner
      k_start = j * k_chunk
      k_blk = jax.lax.dynamic_slice_in_dim(k, k_start, k_chunk, axis=1)
      v_blk = jax.lax.dynamic_slice_in_dim(v, k_start, k_chunk, axis=1)
      k_t_blk = jax.lax.dynamic_slice_in_dim(k_t, k_start, k_chunk, axis=2)
      s_t, keep = scores(q_blk, k_blk, q_start, k_start, kv_len, slopes)
      p_t = jnp.where(keep, jnp.exp(s_t - lse_blk), 0.0)  # [G, kc, qc]
      dv_blk = jnp.einsum('gkq,gqd->gkd', p_t, do_blk)
      dp_t = jnp.einsum('gkd,gqd->gkq', v_blk, do_blk)
      ds_t = p_t * (dp_t - delta_blk) * scale
      dq_t = dq_t + jnp.einsum('gdk,gkq->gdq', k_t_blk, ds_t)
      dk_blk = jnp.einsum('gkq,gqd->gkd', ds_t, q_blk)
      dk = jax.lax.dynamic_update_slice_in_dim(
          dk, jax.lax.dynamic_slice_in_dim(dk, k_start, k_chunk, axis=1) + dk_blk,
          k_start, axis=1)
      dv = jax.lax.dynamic_update_slice_in_dim(
          dv, jax.lax.dynamic_slice_in_dim(dv, k_start, k_chunk, axis=1) + dv_blk,
          k_start, axis=1)
      return dq_t, dk, dv

    first, stop = _key_block_range(q_start, q_chunk, k_chunk, num_k_blocks, causal,
                                   window)
    dq_t = jnp.zeros((q.shape[0], q.shape[2], q_chunk), jnp.float32)
    dq_t, dk, dv = jax.lax.fori_loop(first, stop, body, (dq_t, dk, dv))
    return (dk, dv), dq_t

  init = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
  (dk, dv), dq_t = jax.lax.scan(one_q_block, init, jnp.arange(0, q.shape[1], q_chunk))
  dq = jnp.transpose(dq_t, (1, 0, 3, 2)).reshape(q.shape)  # [nq, G, D, qc] -> [G, Tq', D]
  return dq, dk, dv


def _groups(x, g):
  """[N, ...] -> [N / g, g, ...]: the rows `lax.map` walks through g at a time."""
  return None if x is None else x.reshape(-1, g, *x.shape[1:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9, 10))
def _chunked(q, k, v, kv_len, slopes, causal, q_chunk, k_chunk, t_k, window, group):
  out, _ = _chunked_fwd(q, k, v, kv_len, slopes, causal, q_chunk, k_chunk, t_k,
                        window, group)
  return out


def _chunked_fwd(q, k, v, kv_len, slopes, causal, q_chunk, k_chunk, t_k, window,
                 group):
  fwd = functools.partial(_forward_group, causal=causal, q_chunk=q_chunk,
                          k_chunk=k_chunk, t_k=t_k, window=window)
  out, lse = jax.lax.map(lambda a: fwd(*a),
                         tuple(_groups(x, group) for x in (q, k, v, kv_len, slopes)))
  out, lse = out.reshape(*q.shape[:2], v.shape[-1]), lse.reshape(q.shape[:2])
  return out, (q, k, v, kv_len, slopes, out, lse)


def _chunked_bwd(causal, q_chunk, k_chunk, t_k, window, group, residuals, dout):
  q, k, v, kv_len, slopes, out, lse = residuals
  bwd = functools.partial(_backward_group, causal=causal, q_chunk=q_chunk,
                          k_chunk=k_chunk, t_k=t_k, window=window)
  args = (q, k, v, kv_len, slopes, out, lse, dout.astype(jnp.float32))
  dq, dk, dv = jax.lax.map(lambda a: bwd(*a), tuple(_groups(x, group) for x in args))
  return (dq.reshape(q.shape).astype(q.dtype), dk.reshape(k.shape).astype(k.dtype),
          dv.reshape(v.shape).astype(v.dtype), None,
          None if slopes is None else jnp.zeros_like(slopes))


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def chunked_attention(
    q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, *, causal: bool = False,
    kv_lengths: Optional[jnp.ndarray] = None,
    alibi_slopes: Optional[jnp.ndarray] = None, window: Optional[int] = None,
    q_chunk: int = 512, k_chunk: int = 512, heads_per_step: int = 8) -> jnp.ndarray:
  """Exact attention in O(T · chunk) memory; see the module docstring.

  Args:
    q, k, v: `[B, T_q, H, D]`, `[B, T_k, H_kv, D]`, `[B, T_k, H_kv, D_v]`;
      H_kv divides H (grouped-query attention, see `repeat_kv_heads`).
    causal: query i attends to keys j <= i.
    kv_lengths: optional int `[B]`: keys at positions >= kv_lengths[b] are
      padding. A query with no key left gets a zero output (and zero grads).
    alibi_slopes: optional `[H]`: adds ALiBi's `-slope_h · (i - j)` per block
      (treated as constants: no gradient flows to them).
    window: optional int >= 1: query i attends only to keys j with
      |i - j| < window (indices); blocks outside the band are skipped.
    q_chunk, k_chunk: block sizes (clipped to the lengths).
    heads_per_step: how many (example, head) rows each block step works on
      together (the largest divisor of B · H up to this). Bounds the score
      block at heads_per_step × q_chunk × k_chunk floats whatever the batch;
      8 measured fastest on a 2-core CPU (benchmarks/attention.py).

  Returns:
    out `[B, T_q, H, D_v]` in the dtype of `v`. Attention weights are never
    formed; ask the dense path for them.
  """
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError('chunked_attention takes [batch, length, heads, head_dim] arrays; '
                     f'got q {q.shape}, k {k.shape}, v {v.shape}.')
  (b, t_q, h, d), t_k = q.shape, k.shape[1]
  if k.shape[:2] != (b, t_k) or k.shape[3] != d or v.shape[:2] != (b, t_k):
    raise ValueError(f'incompatible shapes: q {q.shape}, k {k.shape}, v {v.shape}.')
  if window is not None and (not isinstance(window, int) or window < 1):
    raise ValueError(f'window must be an integer >= 1 or None, got {window!r}.')
  k, v = repeat_kv_heads(k, v, h, q.shape)  # gradients sum back over each group
  if q_chunk < 1 or k_chunk < 1:
    raise ValueError(f'chunk sizes must be >= 1, got q_chunk={q_chunk}, k_chunk={k_chunk}.')
  if heads_per_step < 1:
    raise ValueError(f'heads_per_step must be >= 1, got {heads_per_step}.')
  if alibi_slopes is not None and jnp.shape(alibi_slopes) != (h,):
    raise ValueError(f'alibi_slopes must have shape ({h},), got {jnp.shape(alibi_slopes)}.')
  q_chunk, k_chunk = min(q_chunk, t_q), min(k_chunk, t_k)
  kv_lengths = (jnp.full((b,), t_k, jnp.int32) if kv_lengths is None
                else jnp.asarray(kv_lengths, jnp.int32))
  # One row per (example, head), [B · H, T, D]: every block is then a plain
  # slice, and the matmuls batch over the leading axis only.
  rows = lambda x: jnp.transpose(x, (0, 2, 1, 3)).reshape(b * h, x.shape[1], x.shape[3])
  q_r, k_r, v_r = rows(q), rows(k), rows(v)
  q_r, k_r, v_r = _pad_to(q_r, 1, q_chunk), _pad_to(k_r, 1, k_chunk), _pad_to(v_r, 1, k_chunk)
  row_kv_len = jnp.repeat(kv_lengths, h)
  row_slopes = (None if alibi_slopes is None
                else jnp.tile(jnp.asarray(alibi_slopes, jnp.float32), b))
  group = math.gcd(b * h, heads_per_step)
  out = _chunked(q_r, k_r, v_r, row_kv_len, row_slopes, causal, q_chunk, k_chunk, t_k,
                 window, group)
  out = out[:, :t_q].reshape(b, h, t_q, -1)
  return jnp.transpose(out, (0, 2, 1, 3)).astype(v.dtype)
