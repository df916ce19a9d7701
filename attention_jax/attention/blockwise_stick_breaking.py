"""Stick-breaking attention, blockwise: no T × T matrix, O(T · chunk) memory,
forward and backward (Tan et al., ICLR 2025, arXiv 2410.17980).

Causal. With z_ij = q_i·k_j/√D + bias_ij and V_i the keys query i sees
(j < i, or j ≤ i with `attend_current`; inside `kv_lengths` and the window):

    log A_ij = log σ(z_ij) + Σ_{k ∈ V_i, k > j} log σ(-z_ik),
    o_i = Σ_j A_ij v_j + r_i v_i,   r_i = 1 - Σ_j A_ij.

Forward: for each query block, the key blocks are walked from the diagonal
back to the first one the window reaches (right to left), carrying per query
`beyond_i` = Σ log σ(-z_ik) over the keys right of the current block; inside
a block the keys further right add an exclusive suffix sum. Every term is
<= 0, so exp(log A) cannot overflow: no running max or normaliser, unlike
softmax, and no subtraction of large sums.

Backward (a `jax.custom_vjp` recomputing each block, as `chunked.py` does
for softmax; differentiating through the loops would store every block).
With g_i = dL/do_i:

    dv_j = Σ_i A_ij g_i  (+ r_i g_i for j = i, the remainder's value);
    dL/dA_ij = g_i·v_j - g_i·v_i =: dp_ij - u_i;  P_ij := A_ij (dp_ij - u_i);
    ∂log A_ij/∂z_ij = σ(-z_ij),  ∂log A_ij/∂z_ik = -σ(z_ik) for k > j, so
    dz_ik = P_ik σ(-z_ik) - σ(z_ik) Σ_{j<k} P_ij.

The prefix Σ_{j<k} P_ij is S_i - Σ_{j≥k} P_ij with S_i = Σ_j P_ij
= g_i·(o_i - v_i) (expand o_i), known from the forward output like
FlashAttention's rowsum(dO ∘ O); Σ_{j≥k} is carried right to left exactly as
`beyond`. Then dq_i = Σ_k dz_ik k_k/√D, dk_k = Σ_i dz_ik q_i/√D, and a
difference bias gets Σ_k dz_ik (query values) and -Σ_i dz_ik (key values).

Biases by structure, as `chunked_attention`: ALiBi slopes (`-slope·(i - j)`,
constants), a difference bias (`q_values[i] - k_values[j]`, gradients to
both), key padding (`kv_lengths`) and a window (|i - j| < window; blocks
outside it are skipped). Grouped-query k/v heads are repeated first.

Matching the official code (shawntan/stickbreaking-attention,
stickbreaking_attention/sb_ref.py `stickbreaking`, tests/test_attn.py
`ref_fwd`): the same weights and remainder to v_i (the tests' `o + rem[...,
None] * v`); masked keys contribute log β = 0, i.e. the product runs over the
visible keys only. Where we differ: the reference rounds log σ(z) and log β
to the input dtype (bf16) before the cumulative sum; we keep float32
throughout, as our dense version does (bf16 results differ slightly). This
file follows the reference's math, not the tiling of the official Triton
kernels.

Shapes: q `[B, T, H, D]`, k `[B, T, H_kv, D]`, v `[B, T, H_kv, D_v]` ->
out `[B, T, H, D_v]` in v's dtype. Inside, rows `[B · H, T, D]`.
"""

import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp

from attention_jax.attention.blocks import block_scores
from attention_jax.attention.blocks import difference_rows
from attention_jax.attention.blocks import pad_to
from attention_jax.attention.heads import repeat_kv_heads


def _slice(x, start, size):
  """Entries start … start+size-1 of axis 1 (None stays None)."""
  return None if x is None else jax.lax.dynamic_slice_in_dim(x, start, size, axis=1)


def _key_blocks(q_start, qc, kc, num_k_blocks, window):
  """[first, stop) key blocks a causal query block needs: from the one its
  window first reaches to the one holding its diagonal."""
  first_key = 0 if window is None else jnp.maximum(0, q_start - window + 1)
  return first_key // kc, jnp.minimum(num_k_blocks, (q_start + qc - 1) // kc + 1)


def _block(q_blk, k_blk, q_start, k_start, kv_len, slopes, qv_blk, kv_blk, beyond, *,
           scale, t, window, attend_current):
  """One (query block, key block) pair. beyond `[G, qc]`: Σ log σ(-z) of each
  query's visible keys right of this block. -> scores z, keep (bool), A, and
  log β = log σ(-z) (0 where not kept), all float32 `[G, qc, kc]`."""
  z, keep = block_scores(q_blk, k_blk, q_start, k_start, kv_len, slopes, qv_blk, kv_blk,
                         scale=scale, causal=True, t_k=t, window=window)
  if not attend_current:  # block_scores keeps j <= i; the default drops j = i
    own = (q_start + jnp.arange(q_blk.shape[1]))[:, None] == (
        k_start + jnp.arange(k_blk.shape[1]))[None, :]
    keep = keep & ~own[None]
  log_beta = jnp.where(keep, jax.nn.log_sigmoid(-z), 0.0)
  # Σ over the block's keys right of j: the inclusive suffix shifted by one
  # key (exact, as in stick_breaking.py).
  suffix = jax.lax.cumsum(log_beta, axis=2, reverse=True)
  later = jnp.concatenate([suffix[..., 1:], jnp.zeros_like(suffix[..., :1])], -1)
  log_a = jax.nn.log_sigmoid(z) + later + beyond[..., None]  # <= 0: exp is safe
  return z, keep, jnp.where(keep, jnp.exp(log_a), 0.0), log_beta


def _block_options(q, options):
  """`_block`'s keyword options from the static `options` of a call."""
  return dict(scale=1.0 / math.sqrt(q.shape[-1]), t=options['t'], window=options['window'],
              attend_current=options['attend_current'])


def _forward(q, k, v, v_own, kv_len, slopes, qv, kv, *, options):
  """Rows q `[N, Tq', D]` (padded to q_chunk), k, v `[N, Tk', ·]` (to
  k_chunk), v_own = v padded to q_chunk. -> out float32 `[N, Tq', Dv]` and
  the remainder r `[N, Tq']`."""
  q_chunk, k_chunk = options['q_chunk'], options['k_chunk']
  block = functools.partial(_block, **_block_options(q, options))
  n, dv = q.shape[0], v.shape[-1]

  def one_q_block(q_start):
    q_blk, qv_blk = _slice(q, q_start, q_chunk), _slice(qv, q_start, q_chunk)
    first, stop = _key_blocks(q_start, q_chunk, k_chunk, k.shape[1] // k_chunk,
                              options['window'])

    def body(step, carry):
      acc, mass, beyond = carry
      k_start = (stop - 1 - step) * k_chunk  # right to left
      _, _, a, log_beta = block(q_blk, _slice(k, k_start, k_chunk), q_start, k_start,
                                kv_len, slopes, qv_blk, _slice(kv, k_start, k_chunk),
                                beyond)
      acc = acc + jnp.einsum('gqk,gkd->gqd', a, _slice(v, k_start, k_chunk),
                             preferred_element_type=jnp.float32)
      return acc, mass + a.sum(-1), beyond + log_beta.sum(-1)

    zeros = jnp.zeros((n, q_chunk), jnp.float32)
    init = (jnp.zeros((n, q_chunk, dv), jnp.float32), zeros, zeros)
    acc, mass, _ = jax.lax.fori_loop(0, stop - first, body, init)
    rem = 1.0 - mass
    own = _slice(v_own, q_start, q_chunk).astype(jnp.float32)
    return acc + rem[..., None] * own, rem

  out, rem = jax.lax.map(one_q_block, jnp.arange(0, q.shape[1], q_chunk))
  # [nq, N, qc, ·] -> [N, Tq', ·]
  return (jnp.swapaxes(out, 0, 1).reshape(n, -1, dv), jnp.swapaxes(rem, 0, 1).reshape(n, -1))


def _backward(q, k, v, v_own, kv_len, slopes, qv, kv, out, rem, g, *, options):
  """The module docstring's backward. g = dL/d out float32 `[N, Tq', Dv]`.
  -> dq, dk, dv, dv_own, d qv, d kv (None without a difference bias), float32."""
  q_chunk, k_chunk = options['q_chunk'], options['k_chunk']
  block_opts = _block_options(q, options)
  block = functools.partial(_block, **block_opts)
  scale = block_opts['scale']
  v_own = v_own.astype(jnp.float32)
  s_all = jnp.einsum('nqd,nqd->nq', g, out - v_own)  # S_i = Σ_j P_ij
  u_all = jnp.einsum('nqd,nqd->nq', g, v_own)  # u_i = g_i·v_i
  n = q.shape[0]

  def one_q_block(carry, q_start):
    q_blk, qv_blk = _slice(q, q_start, q_chunk), _slice(qv, q_start, q_chunk)
    g_blk = _slice(g, q_start, q_chunk)
    s_blk, u_blk = _slice(s_all, q_start, q_chunk), _slice(u_all, q_start, q_chunk)
    first, stop = _key_blocks(q_start, q_chunk, k_chunk, k.shape[1] // k_chunk,
                              options['window'])

    def body(step, inner):
      dq, dqv, beyond, p_right, dk, dv, dkv = inner
      k_start = (stop - 1 - step) * k_chunk
      k_blk, v_blk = _slice(k, k_start, k_chunk), _slice(v, k_start, k_chunk)
      z, keep, a, log_beta = block(q_blk, k_blk, q_start, k_start, kv_len, slopes, qv_blk,
                                   _slice(kv, k_start, k_chunk), beyond)
      dp = jnp.einsum('gqd,gkd->gqk', g_blk, v_blk, preferred_element_type=jnp.float32)
      p = a * (dp - u_blk[..., None])
      # Σ_{j<k} P_ij = S_i - Σ_{j≥k} P_ij: blocks to the right plus this
      # block's inclusive suffix.
      left = s_blk[..., None] - (jax.lax.cumsum(p, axis=2, reverse=True)
                                 + p_right[..., None])
      dz = jnp.where(keep, p * jax.nn.sigmoid(-z) - jax.nn.sigmoid(z) * left, 0.0)
      add = lambda acc, blk: jax.lax.dynamic_update_slice_in_dim(
          acc, _slice(acc, k_start, k_chunk) + blk, k_start, axis=1)
      dq = dq + scale * jnp.einsum('gqk,gkd->gqd', dz, k_blk,
                                   preferred_element_type=jnp.float32)
      dk = add(dk, scale * jnp.einsum('gqk,gqd->gkd', dz, q_blk,
                                      preferred_element_type=jnp.float32))
      dv = add(dv, jnp.einsum('gqk,gqd->gkd', a, g_blk))
      if qv is not None:
        dqv, dkv = dqv + dz.sum(2), add(dkv, -dz.sum(1))
      return dq, dqv, beyond + log_beta.sum(-1), p_right + p.sum(-1), dk, dv, dkv

    zeros = jnp.zeros((n, q_chunk), jnp.float32)
    dqv = None if qv is None else zeros
    init = (jnp.zeros(q_blk.shape, jnp.float32), dqv, zeros, zeros, *carry)
    dq, dqv, _, _, dk, dv, dkv = jax.lax.fori_loop(0, stop - first, body, init)
    return (dk, dv, dkv), (dq, dqv)

  init = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32),
          None if kv is None else jnp.zeros(kv.shape, jnp.float32))
  (dk, dv, dkv), (dq, dqv) = jax.lax.scan(one_q_block, init,
                                          jnp.arange(0, q.shape[1], q_chunk))
  dq = jnp.swapaxes(dq, 0, 1).reshape(q.shape)  # [nq, N, qc, D] -> [N, Tq', D]
  if dqv is not None:
    dqv = jnp.swapaxes(dqv, 0, 1).reshape(qv.shape)
  return dq, dk, dv, rem[..., None] * g, dqv, dkv


@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _rows(q, k, v, v_own, kv_len, slopes, qv, kv, options):
  return _forward(q, k, v, v_own, kv_len, slopes, qv, kv, options=dict(options))[0]


def _rows_fwd(q, k, v, v_own, kv_len, slopes, qv, kv, options):
  out, rem = _forward(q, k, v, v_own, kv_len, slopes, qv, kv, options=dict(options))
  return out, (q, k, v, v_own, kv_len, slopes, qv, kv, out, rem)


def _rows_bwd(options, residuals, g):
  q, k, v, v_own, kv_len, slopes, qv, kv, out, rem = residuals
  dq, dk, dv, dv_own, dqv, dkv = _backward(q, k, v, v_own, kv_len, slopes, qv, kv, out,
                                           rem, g.astype(jnp.float32),
                                           options=dict(options))
  cast = lambda d, like: None if like is None else d.astype(like.dtype)
  return (cast(dq, q), cast(dk, k), cast(dv, v), cast(dv_own, v_own), None,
          None if slopes is None else jnp.zeros_like(slopes), cast(dqv, qv), cast(dkv, kv))


_rows.defvjp(_rows_fwd, _rows_bwd)


def chunked_stick_breaking(
    q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, *,
    kv_lengths: Optional[jnp.ndarray] = None, alibi_slopes: Optional[jnp.ndarray] = None,
    difference: Optional[tuple[jnp.ndarray, jnp.ndarray]] = None,
    window: Optional[int] = None, attend_current: bool = False, remainder: str = 'value',
    q_chunk: int = 128, k_chunk: int = 128) -> jnp.ndarray:
  """Causal stick-breaking attention without a T × T matrix (module docstring).

  Args:
    q, k, v: `[B, T, H, D]`, `[B, T, H_kv, D]`, `[B, T, H_kv, D_v]`; H_kv
      divides H. Query i's own key and value are index i.
    kv_lengths: optional int `[B]`: keys at index >= kv_lengths[b] are
      padding. A query with no visible key gets its own value v_i.
    alibi_slopes: optional `[H]`: adds `-slope_h · (i - j)` (no gradient).
    difference: optional (q_values `[B|1, T, H]`, k_values `[B|1, T, H]`):
      adds `q_values[b, i, h] - k_values[b, j, h]`; gradients flow to both.
    window: optional int >= 1: only keys with |i - j| < window are visible.
    attend_current: whether key i is among query i's keys (official default
      False).
    remainder: 'value' adds r_i v_i; 'head_bias' adds nothing (the module
      adds r_i b_h; `StickBreaking`).
    q_chunk, k_chunk: block sizes (clipped to T; need not divide it).

  Returns:
    out `[B, T, H, D_v]` in the dtype of `v`.
  """
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError('chunked_stick_breaking takes [batch, length, heads, head_dim] arrays; '
                     f'got q {q.shape}, k {k.shape}, v {v.shape}.')
  b, t, h, d = q.shape
  if k.shape[:2] != (b, t) or k.shape[3] != d or v.shape[:2] != (b, t):
    raise ValueError(f'stick-breaking is causal: it needs q, k, v of one length and batch '
                     f'(k [B, T, H_kv, D], v [B, T, H_kv, D_v]); got q {q.shape}, '
                     f'k {k.shape}, v {v.shape}.')
  if window is not None and (not isinstance(window, int) or window < 1):
    raise ValueError(f'window must be an integer >= 1 or None, got {window!r}.')
  if not isinstance(q_chunk, int) or not isinstance(k_chunk, int) or min(q_chunk,
                                                                         k_chunk) < 1:
    raise ValueError(f'chunk sizes must be integers >= 1, got q_chunk={q_chunk!r}, '
                     f'k_chunk={k_chunk!r}.')
  k, v = repeat_kv_heads(k, v, h, q.shape)  # gradients sum back over each group
  q_chunk, k_chunk = min(q_chunk, t), min(k_chunk, t)
  rows = lambda x: jnp.transpose(x, (0, 2, 1, 3)).reshape(b * h, t, x.shape[3])
  q_r, k_r, v_r = rows(q), rows(k), rows(v)
  kv_len = jnp.repeat(jnp.full((b,), t, jnp.int32) if kv_lengths is None
                      else jnp.asarray(kv_lengths, jnp.int32), h)
  slopes = None
  if alibi_slopes is not None:
    slopes = jnp.asarray(alibi_slopes, jnp.float32)
    if slopes.shape != (h,):
      raise ValueError(f'alibi_slopes must have shape ({h},), got {slopes.shape}.')
    slopes = jnp.tile(slopes, b)
  qv = kv = None
  if difference is not None:
    qv, kv = difference_rows(difference, b, h, t, t)
    qv, kv = pad_to(qv, 1, q_chunk), pad_to(kv, 1, k_chunk)
  options = (('q_chunk', q_chunk), ('k_chunk', k_chunk), ('t', t), ('window', window),
             ('attend_current', bool(attend_current)))
  # No remainder term: a zero own value (the forward and backward hold for any v_own).
  v_own = pad_to(v_r if remainder == 'value' else jnp.zeros_like(v_r), 1, q_chunk)
  out = _rows(pad_to(q_r, 1, q_chunk), pad_to(k_r, 1, k_chunk), pad_to(v_r, 1, k_chunk),
              v_own, kv_len, slopes, qv, kv, options)
  out = out[:, :t].reshape(b, h, t, -1)
  return jnp.transpose(out, (0, 2, 1, 3)).astype(v.dtype)
