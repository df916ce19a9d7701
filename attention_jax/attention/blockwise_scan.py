"""`chunked_attention`'s 'scan' strategy: a loop over query blocks and, inside,
over key blocks with an online softmax (FlashAttention). Any length, O(T ·
chunk) memory, a program whose size does not grow with T.

Each function works on G rows (one per example and head): q `[G, Tq', D]`
padded to a multiple of q_chunk, k / v `[G, Tk', D]` padded to k_chunk,
kv_len and slopes `[G]`, a difference bias's qv `[G, Tq']` and kv `[G, Tk']`
or None, segment ids qs `[G, Tq']` and ks `[G, Tk']` or None (see
`blocks.py`).

With segment ids, each query block loops only over the key blocks between
the first and the last whose range of ids [min, max] meets its own (over
the G rows): a key block outside that span holds no key of an id the query
block has. With documents packed in order (ids non-decreasing along the
row) that is the span of the query block's own documents, so a causal row
of documents of length L costs about T · L instead of T² / 2. Blocks inside
the span are masked, not skipped.
"""

import functools
import math

import jax
import jax.numpy as jnp

from attention_jax.attention.blocks import backward_block
from attention_jax.attention.blocks import block_scores
from attention_jax.attention.blocks import normalise
from attention_jax.attention.dense import MASK_VALUE
from attention_jax.attention.sink_logits import join_sink


def _key_block_range(q_start, qc, kc, num_k_blocks, causal, window):
  """[first, stop) key blocks a query block needs: those holding a key at or
  below the causal diagonal and inside the window of some query of the block."""
  last_key = q_start + qc - 1 if causal else num_k_blocks * kc - 1
  first_key = 0
  if window is not None:
    first_key = jnp.maximum(0, q_start - window + 1)
    last_key = jnp.minimum(last_key, q_start + qc - 1 + window - 1)
  return first_key // kc, jnp.minimum(num_k_blocks, last_key // kc + 1)


def _id_ranges(ids, chunk):
  """Per block of `chunk` columns of ids `[G, T']`: (min, max) over its G
  rows, `[T' / chunk]` each."""
  blocks = ids.reshape(ids.shape[0], -1, chunk)
  return blocks.min((0, 2)), blocks.max((0, 2))


def _segment_block_range(first, stop, qs, q_start, q_chunk, k_ranges):
  """[first, stop) narrowed to the key blocks from the first to the last
  whose id range meets the query block's (module docstring); unchanged
  without segment ids."""
  if qs is None:
    return first, stop
  q_ids = jax.lax.dynamic_slice_in_dim(qs, q_start, q_chunk, axis=1)
  k_lo, k_hi = k_ranges
  meets = (k_lo <= q_ids.max()) & (k_hi >= q_ids.min())
  index = jnp.arange(k_lo.shape[0])
  first = jnp.maximum(first, jnp.min(jnp.where(meets, index, k_lo.shape[0])))
  stop = jnp.minimum(stop, jnp.max(jnp.where(meets, index, -1)) + 1)
  return first, jnp.maximum(first, stop)


def forward_group(q, k, v, kv_len, slopes, qv, kv, qs, ks, sink, *, causal, q_chunk,
                  k_chunk, t_k, window, cap):
  """Returns out `[G, Tq', Dv]` float32 and the row log-sum-exp `[G, Tq']`
  (with the sink logits `sink` `[G]`, if given, in its denominator)."""
  scale = 1.0 / math.sqrt(q.shape[-1])
  num_k_blocks = k.shape[1] // k_chunk
  g, dv = q.shape[0], v.shape[-1]
  scores = functools.partial(block_scores, scale=scale, causal=causal, t_k=t_k,
                             window=window, cap=cap)
  k_ranges = None if ks is None else _id_ranges(ks, k_chunk)

  def one_q_block(q_start):
    q_blk = jax.lax.dynamic_slice_in_dim(q, q_start, q_chunk, axis=1)
    qv_blk, qs_blk = _slice(qv, q_start, q_chunk), _slice(qs, q_start, q_chunk)

    def body(j, carry):
      m, l, acc = carry
      k_blk = jax.lax.dynamic_slice_in_dim(k, j * k_chunk, k_chunk, axis=1)
      v_blk = jax.lax.dynamic_slice_in_dim(v, j * k_chunk, k_chunk, axis=1)
      s, keep = scores(q_blk, k_blk, q_start, j * k_chunk, kv_len, slopes, qv_blk,
                       _slice(kv, j * k_chunk, k_chunk), qs_blk,
                       _slice(ks, j * k_chunk, k_chunk))
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
    first, stop = _segment_block_range(
        *_key_block_range(q_start, q_chunk, k_chunk, num_k_blocks, causal, window),
        qs, q_start, q_chunk, k_ranges)
    m, l, acc = jax.lax.fori_loop(first, stop, body, init)
    if sink is not None:
      m, l, acc = join_sink(m, l, acc, sink[:, None])
    return normalise(m, l, acc)

  out, lse = jax.lax.map(one_q_block, jnp.arange(0, q.shape[1], q_chunk))
  # [nq, G, qc, Dv], [nq, G, qc] -> [G, Tq', Dv], [G, Tq']
  return (jnp.swapaxes(out, 0, 1).reshape(g, -1, dv),
          jnp.swapaxes(lse, 0, 1).reshape(g, -1))


def _slice(x, start, size):
  """Columns start … start+size-1 of a `[G, T]` row array (None stays None)."""
  return None if x is None else jax.lax.dynamic_slice_in_dim(x, start, size, axis=1)


def backward_group(q, k, v, k_t, kv_len, slopes, qv, kv, qs, ks, delta, lse, dout, *,
                   causal, q_chunk, k_chunk, t_k, window, cap):
  """dq, dk, dv (float32, shaped as q, k, v) and d qv, d kv (None without a
  difference bias), recomputing each block. k_t is k transposed `[G, D, Tk']`,
  delta = rowsum(dO ∘ O) `[G, Tq']`."""
  num_k_blocks = k.shape[1] // k_chunk
  grads = functools.partial(backward_block, scale=1.0 / math.sqrt(q.shape[-1]),
                            causal=causal, t_k=t_k, window=window, cap=cap)
  k_ranges = None if ks is None else _id_ranges(ks, k_chunk)

  def one_q_block(carry, q_start):
    q_blk = jax.lax.dynamic_slice_in_dim(q, q_start, q_chunk, axis=1)
    do_blk = jax.lax.dynamic_slice_in_dim(dout, q_start, q_chunk, axis=1)
    lse_blk = jax.lax.dynamic_slice_in_dim(lse, q_start, q_chunk, axis=1)[:, None, :]
    delta_blk = jax.lax.dynamic_slice_in_dim(delta, q_start, q_chunk, axis=1)[:, None, :]
    qv_blk, qs_blk = _slice(qv, q_start, q_chunk), _slice(qs, q_start, q_chunk)

    def body(j, inner):
      dq_t, dqv, dk, dv, dkv = inner
      k_start = j * k_chunk
      piece = lambda x, axis=1: jax.lax.dynamic_slice_in_dim(x, k_start, k_chunk, axis)
      dq_t_blk, dk_blk, dv_blk, dqv_blk, dkv_blk = grads(
          q_blk, do_blk, lse_blk, delta_blk, piece(k), piece(v), piece(k_t, 2), q_start,
          k_start, kv_len, slopes, qv_blk, _slice(kv, k_start, k_chunk), qs_blk,
          _slice(ks, k_start, k_chunk))
      add = lambda acc, blk: jax.lax.dynamic_update_slice_in_dim(
          acc, piece(acc) + blk, k_start, axis=1)
      if qv is None:
        return dq_t + dq_t_blk, dqv, add(dk, dk_blk), add(dv, dv_blk), dkv
      return (dq_t + dq_t_blk, dqv + dqv_blk, add(dk, dk_blk), add(dv, dv_blk),
              add(dkv, dkv_blk))

    first, stop = _segment_block_range(
        *_key_block_range(q_start, q_chunk, k_chunk, num_k_blocks, causal, window),
        qs, q_start, q_chunk, k_ranges)
    dq_t = jnp.zeros((q.shape[0], q.shape[2], q_chunk), jnp.float32)
    dqv = None if qv is None else jnp.zeros((q.shape[0], q_chunk), jnp.float32)
    dq_t, dqv, dk, dv, dkv = jax.lax.fori_loop(first, stop, body, (dq_t, dqv, *carry))
    return (dk, dv, dkv), (dq_t, dqv)

  init = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32),
          None if kv is None else jnp.zeros(kv.shape, jnp.float32))
  (dk, dv, dkv), (dq_t, dqv) = jax.lax.scan(one_q_block, init,
                                            jnp.arange(0, q.shape[1], q_chunk))
  dq = jnp.transpose(dq_t, (1, 0, 3, 2)).reshape(q.shape)  # [nq, G, D, qc] -> [G, Tq', D]
  if dqv is not None:
    dqv = jnp.swapaxes(dqv, 0, 1).reshape(qv.shape)  # [nq, G, qc] -> [G, Tq']
  return dq, dk, dv, dqv, dkv
