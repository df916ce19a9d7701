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
out `[B, T_q, H, D_v]` in the dtype of v. Arithmetic in float32.
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
                  t_k, window):
  """Scores and keep-mask of one (q block, k block) pair for one example.

  q_blk `[qc, H, D]`, k_blk `[kc, H, D]` -> scores `[H, qc, kc]` float32, keep
  `[H or 1, qc, kc]` bool.
  """
  qc, kc = q_blk.shape[0], k_blk.shape[0]
  s = jnp.einsum('qhd,khd->hqk', q_blk, k_blk, preferred_element_type=jnp.float32) * scale
  q_idx = q_start + jnp.arange(qc)[:, None]
  k_idx = k_start + jnp.arange(kc)[None, :]
  if slopes is not None:
    s = s - slopes[:, None, None] * (q_idx - k_idx).astype(jnp.float32)[None]
  keep = k_idx < jnp.minimum(kv_len, t_k)  # padding, and the blocks' own padding
  if causal:
    keep = keep & (k_idx <= q_idx)
  if window is not None:
    keep = keep & (jnp.abs(q_idx - k_idx) < window)
  return s, keep[None]


def _key_block_range(q_start, qc, kc, num_k_blocks, causal, window):
  """[first, stop) key blocks a query block needs: those holding a key at or
  below the causal diagonal and inside the window of some query of the block."""
  last_key = q_start + qc - 1 if causal else num_k_blocks * kc - 1
  first_key = 0
  if window is not None:
    first_key = jnp.maximum(0, q_start - window + 1)
    last_key = jnp.minimum(last_key, q_start + qc - 1 + window - 1)
  return first_key // kc, jnp.minimum(num_k_blocks, last_key // kc + 1)


def _forward_example(q, k, v, kv_len, slopes, *, causal, q_chunk, k_chunk, t_k,
                     window):
  """One example: q `[Tq', H, D]` (padded to q_chunk), k/v padded to k_chunk.
  Returns out `[Tq', H, Dv]` float32 and lse `[H, Tq']`."""
  scale = 1.0 / math.sqrt(q.shape[-1])
  num_k_blocks = k.shape[0] // k_chunk
  h, dv = q.shape[1], v.shape[-1]

  def one_q_block(q_start):
    q_blk = jax.lax.dynamic_slice_in_dim(q, q_start, q_chunk)

    def body(j, carry):
      m, l, acc = carry
      k_blk = jax.lax.dynamic_slice_in_dim(k, j * k_chunk, k_chunk)
      v_blk = jax.lax.dynamic_slice_in_dim(v, j * k_chunk, k_chunk)
      s, keep = _block_scores(q_blk, k_blk, q_start, j * k_chunk, kv_len, slopes,
                              scale=scale, causal=causal, t_k=t_k, window=window)
      s = jnp.where(keep, s, MASK_VALUE)
      m_new = jnp.maximum(m, s.max(-1))
      p = jnp.where(keep, jnp.exp(s - m_new[..., None]), 0.0)
      correction = jnp.exp(m - m_new)
      l = l * correction + p.sum(-1)
      acc = acc * correction[..., None] + jnp.einsum(
          'hqk,khd->hqd', p, v_blk, preferred_element_type=jnp.float32)
      return m_new, l, acc

    init = (jnp.full((h, q_chunk), MASK_VALUE, jnp.float32),
            jnp.zeros((h, q_chunk), jnp.float32),
            jnp.zeros((h, q_chunk, dv), jnp.float32))
    first, stop = _key_block_range(q_start, q_chunk, k_chunk, num_k_blocks, causal,
                                   window)
    m, l, acc = jax.lax.fori_loop(first, stop, body, init)
    safe_l = jnp.where(l > 0, l, 1.0)  # l == 0: no key to attend -> zero output
    out = jnp.where((l > 0)[..., None], acc / safe_l[..., None], 0.0)
    lse = jnp.where(l > 0, m + jnp.log(safe_l), jnp.inf)  # exp(s - inf) = 0 below
    return jnp.transpose(out, (1, 0, 2)), lse

  starts = jnp.arange(0, q.shape[0], q_chunk)
  out, lse = jax.lax.map(one_q_block, starts)  # [nq, qc, H, Dv], [nq, H, qc]
  return out.reshape(-1, h, dv), jnp.transpose(lse, (1, 0, 2)).reshape(h, -1)


def _backward_example(q, k, v, kv_len, slopes, out, lse, dout, *, causal, q_chunk,
                      k_chunk, t_k, window):
  """FlashAttention's backward for one example, recomputing each block."""
  scale = 1.0 / math.sqrt(q.shape[-1])
  num_k_blocks = k.shape[0] // k_chunk
  delta = jnp.einsum('qhd,qhd->hq', dout, out)  # rowsum(dO ∘ O), [H, Tq']

  def one_q_block(carry, q_start):
    dk, dv = carry
    q_blk = jax.lax.dynamic_slice_in_dim(q, q_start, q_chunk)
    do_blk = jax.lax.dynamic_slice_in_dim(dout, q_start, q_chunk)
    lse_blk = jax.lax.dynamic_slice_in_dim(lse, q_start, q_chunk, axis=1)
    delta_blk = jax.lax.dynamic_slice_in_dim(delta, q_start, q_chunk, axis=1)

    def body(j, inner):
      dq_blk, dk, dv = inner
      k_start = j * k_chunk
      k_blk = jax.lax.dynamic_slice_in_dim(k, k_start, k_chunk)
      v_blk = jax.lax.dynamic_slice_in_dim(v, k_start, k_chunk)
      s, keep = _block_scores(q_blk, k_blk, q_start, k_start, kv_len, slopes,
                              scale=scale, causal=causal, t_k=t_k, window=window)
      p = jnp.where(keep, jnp.exp(s - lse_blk[..., None]), 0.0)  # [H, qc, kc]
      dv_blk = jnp.einsum('hqk,qhd->khd', p, do_blk)
      dp = jnp.einsum('qhd,khd->hqk', do_blk, v_blk)
      ds = p * (dp - delta_blk[..., None]) * scale
      dq_blk = dq_blk + jnp.einsum('hqk,khd->qhd', ds, k_blk)
      dk_blk = jnp.einsum('hqk,qhd->khd', ds, q_blk)
      dk = jax.lax.dynamic_update_slice_in_dim(
          dk, jax.lax.dynamic_slice_in_dim(dk, k_start, k_chunk) + dk_blk, k_start, 0)
      dv = jax.lax.dynamic_update_slice_in_dim(
          dv, jax.lax.dynamic_slice_in_dim(dv, k_start, k_chunk) + dv_blk, k_start, 0)
      return dq_blk, dk, dv

    first, stop = _key_block_range(q_start, q_chunk, k_chunk, num_k_blocks, causal,
                                   window)
    dq_blk, dk, dv = jax.lax.fori_loop(
        first, stop, body, (jnp.zeros(q_blk.shape, jnp.float32), dk, dv))
    return (dk, dv), dq_blk

  init = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
  (dk, dv), dq = jax.lax.scan(one_q_block, init, jnp.arange(0, q.shape[0], q_chunk))
  return dq.reshape(q.shape), dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def _chunked(q, k, v, kv_lengths, slopes, causal, q_chunk, k_chunk, t_k, window):
  out, _ = _chunked_fwd(q, k, v, kv_lengths, slopes, causal, q_chunk, k_chunk, t_k,
                        window)
  return out


def _chunked_fwd(q, k, v, kv_lengths, slopes, causal, q_chunk, k_chunk, t_k, window):
  fwd = functools.partial(_forward_example, causal=causal, q_chunk=q_chunk,
                          k_chunk=k_chunk, t_k=t_k, window=window)
  out, lse = jax.vmap(fwd, in_axes=(0, 0, 0, 0, None))(q, k, v, kv_lengths, slopes)
  return out, (q, k, v, kv_lengths, slopes, out, lse)


def _chunked_bwd(causal, q_chunk, k_chunk, t_k, window, residuals, dout):
  q, k, v, kv_lengths, slopes, out, lse = residuals
  bwd = functools.partial(_backward_example, causal=causal, q_chunk=q_chunk,
                          k_chunk=k_chunk, t_k=t_k, window=window)
  dq, dk, dv = jax.vmap(bwd, in_axes=(0, 0, 0, 0, None, 0, 0, 0))(
      q, k, v, kv_lengths, slopes, out, lse, dout.astype(jnp.float32))
  return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None,
          None if slopes is None else jnp.zeros_like(slopes))


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def chunked_attention(
    q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, *, causal: bool = False,
    kv_lengths: Optional[jnp.ndarray] = None,
    alibi_slopes: Optional[jnp.ndarray] = None, window: Optional[int] = None,
    q_chunk: int = 512, k_chunk: int = 512) -> jnp.ndarray:
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
  if alibi_slopes is not None and jnp.shape(alibi_slopes) != (h,):
    raise ValueError(f'alibi_slopes must have shape ({h},), got {jnp.shape(alibi_slopes)}.')
  q_chunk, k_chunk = min(q_chunk, t_q), min(k_chunk, t_k)
  kv_lengths = (jnp.full((b,), t_k, jnp.int32) if kv_lengths is None
                else jnp.asarray(kv_lengths, jnp.int32))
  slopes = None if alibi_slopes is None else jnp.asarray(alibi_slopes, jnp.float32)
  qp, kp, vp = _pad_to(q, 1, q_chunk), _pad_to(k, 1, k_chunk), _pad_to(v, 1, k_chunk)
  out = _chunked(qp, kp, vp, kv_lengths, slopes, causal, q_chunk, k_chunk, t_k, window)
  return out[:, :t_q].astype(v.dtype)
