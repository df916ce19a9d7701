"""`chunked_attention`'s 'unrolled' strategy: query blocks unrolled at trace
time, each scored against all the keys it may see in ONE block (the causal
prefix, the window), the query chunking of Rabe & Staats (2021).

Because every block's key range is a static slice, there is no online
rescaling and no key block half above the diagonal: one wide matmul per
block, with the work of exact causal attention up to the query-block
granularity. On CPU this beats the scan at moderate lengths (see
`chunked.UNROLLED_MAX_LENGTH` and benchmarks/README.md). The price is a
program, and a compile time, that grow with T_q / q_chunk, and score blocks
of q_chunk × (visible keys): so it serves moderate lengths; 'scan' serves
any length.

Segment ids are masked in each block, not skipped: the slices are static,
the documents' places are data.

Shapes as in `blockwise_scan.py`: G rows, q `[G, Tq', D]` padded to q_chunk.
"""

import functools
import math

import jax.numpy as jnp

from attention_jax.attention.blocks import backward_block
from attention_jax.attention.blocks import block_scores
from attention_jax.attention.blocks import normalise
from attention_jax.attention.dense import MASK_VALUE
from attention_jax.attention.sink_logits import join_sink


def _visible_keys(q_start, qc, t_k, causal, window):
  """Static [lo, hi): the keys some query of the block may attend to."""
  lo, hi = 0, t_k
  if causal:
    hi = min(hi, q_start + qc)
  if window is not None:
    lo = max(0, q_start - window + 1)
    hi = min(hi, q_start + qc - 1 + window)
  return lo, max(lo, hi)


def _cols(x, lo, hi):
  """Columns lo … hi-1 of a `[G, T]` row array (None stays None)."""
  return None if x is None else x[:, lo:hi]


def forward_group(q, k, v, kv_len, slopes, qv, kv, qs, ks, sink, *, causal, q_chunk, t_k,
                  window, cap):
  """Returns out `[G, Tq', Dv]` float32 and the row log-sum-exp `[G, Tq']`
  (with the sink logits `sink` `[G]`, if given, in its denominator)."""
  g, dv = q.shape[0], v.shape[-1]
  scores = functools.partial(block_scores, scale=1.0 / math.sqrt(q.shape[-1]),
                             causal=causal, t_k=t_k, window=window, cap=cap)
  outs, lses = [], []
  for q_start in range(0, q.shape[1], q_chunk):
    lo, hi = _visible_keys(q_start, q_chunk, t_k, causal, window)
    if lo == hi:  # no key to attend: zero output, as `normalise` gives
      outs.append(jnp.zeros((g, q_chunk, dv), jnp.float32))
      lses.append(jnp.full((g, q_chunk), jnp.inf, jnp.float32))
      continue
    s, keep = scores(q[:, q_start:q_start + q_chunk], k[:, lo:hi], q_start, lo, kv_len,
                     slopes, _cols(qv, q_start, q_start + q_chunk), _cols(kv, lo, hi),
                     _cols(qs, q_start, q_start + q_chunk), _cols(ks, lo, hi))
    s = jnp.where(keep, s, MASK_VALUE)
    m = s.max(-1)
    p = jnp.where(keep, jnp.exp(s - m[..., None]), 0.0)
    acc = jnp.einsum('gqk,gkd->gqd', p, v[:, lo:hi], preferred_element_type=jnp.float32)
    l = p.sum(-1)
    if sink is not None:
      m, l, acc = join_sink(m, l, acc, sink[:, None])
    out, lse = normalise(m, l, acc)
    outs.append(out)
    lses.append(lse)
  return jnp.concatenate(outs, axis=1), jnp.concatenate(lses, axis=1)


def backward_group(q, k, v, k_t, kv_len, slopes, qv, kv, qs, ks, delta, lse, dout, *,
                   causal, q_chunk, t_k, window, cap):
  """dq, dk, dv (float32, shaped as q, k, v) and d qv, d kv (None without a
  difference bias). k_t is k transposed `[G, D, Tk']`, delta = rowsum(dO ∘ O)
  `[G, Tq']`."""
  grads = functools.partial(backward_block, scale=1.0 / math.sqrt(q.shape[-1]),
                            causal=causal, t_k=t_k, window=window, cap=cap)
  dqs, dqvs = [], []
  dk, dv = jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32)
  dkv = None if kv is None else jnp.zeros(kv.shape, jnp.float32)
  for q_start in range(0, q.shape[1], q_chunk):
    rows = slice(q_start, q_start + q_chunk)
    lo, hi = _visible_keys(q_start, q_chunk, t_k, causal, window)
    if lo == hi:
      dqs.append(jnp.zeros((q.shape[0], q_chunk, q.shape[2]), jnp.float32))
      dqvs.append(jnp.zeros((q.shape[0], q_chunk), jnp.float32))
      continue
    dq_t, dk_blk, dv_blk, dqv_blk, dkv_blk = grads(
        q[:, rows], dout[:, rows], lse[:, None, rows], delta[:, None, rows], k[:, lo:hi],
        v[:, lo:hi], k_t[:, :, lo:hi], q_start, lo, kv_len, slopes,
        _cols(qv, q_start, q_start + q_chunk), _cols(kv, lo, hi),
        _cols(qs, q_start, q_start + q_chunk), _cols(ks, lo, hi))
    dqs.append(jnp.swapaxes(dq_t, 1, 2))
    dk = dk.at[:, lo:hi].add(dk_blk)
    dv = dv.at[:, lo:hi].add(dv_blk)
    if kv is not None:
      dqvs.append(dqv_blk)
      dkv = dkv.at[:, lo:hi].add(dkv_blk)
  dqv = None if qv is None else jnp.concatenate(dqvs, axis=1)
  return jnp.concatenate(dqs, axis=1), dk, dv, dqv, dkv
