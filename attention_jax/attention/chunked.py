"""Blockwise attention: no T_q × T_k matrix in memory, exact, forward and backward.

The algorithms of Rabe & Staats (2021) and FlashAttention (Dao et al. 2022)
in pure JAX, with two strategies over one block math (`blocks.py`):

* 'scan' (`blockwise_scan.py`): a loop over query blocks and, inside, over
  key blocks of `k_chunk` with an online softmax (running row max, normaliser
  and unnormalised output). Any length; O(T · chunk) memory; the program's
  size does not depend on T.
* 'unrolled' (`blockwise_unrolled.py`): query blocks unrolled at trace time,
  each scored against all the keys it may see in one block (a static slice):
  no rescaling, one wide matmul per block, no key block half above the
  diagonal. Faster on CPU at moderate lengths; its program grows with T.
* 'auto': 'unrolled' while queries and keys are both at most
  `UNROLLED_MAX_LENGTH`, else 'scan'.

The backward pass is a `jax.custom_vjp` that stores only the output and the
row log-sum-exp and recomputes each block's probabilities, as FlashAttention
does; differentiating through the loops instead would store every block.

Masks and biases are given by structure, not as T × T arrays, so that they too
are built per block: `causal`, per-example `kv_lengths` (key padding),
per-head `alibi_slopes` (ALiBi's `-slope · (i - j)`), a `difference` bias
(`q_values[i] - k_values[j]` per example and head, e.g. forgetting
attention's cumulative gates, with gradients to both) and a sliding `window`
(`|i - j| < window`), and segment ids (packed documents: query i keeps key
j only where their ids are equal, `segments.py`). Key blocks entirely above
the causal diagonal or outside the window are never computed, so windowed
attention costs O(T · window); with segment ids 'scan' also skips the key
blocks that hold no id of the query block (`blockwise_scan.py`), 'unrolled'
masks them. Gemma 2's logit soft-capping (`soft_cap.py`) acts on each
block's scores, and gpt-oss's learned sink logits (`sink_logits.py`) join
each row's running max and normaliser once, after its last key block: still
O(T) memory. Arbitrary dense masks and biases belong to `dense.py`.

Shapes: q `[B, T_q, H, D]`, k `[B, T_k, H, D]`, v `[B, T_k, H, D_v]`;
out `[B, T_q, H, D_v]` in the dtype of v. Arithmetic in float32. Inside, the
arrays are laid out as rows `[B · H, T, D]` (one per example and head) and
walked `heads_per_step` rows at a time, so a block's scores are
`[heads_per_step, q_chunk, keys]` whatever the batch size.
"""

import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp

from attention_jax.attention import blockwise_scan
from attention_jax.attention import blockwise_unrolled
from attention_jax.attention.blockwise_stick_breaking import chunked_stick_breaking
from attention_jax.attention.blocks import difference_rows
from attention_jax.attention.checks import check_array
from attention_jax.attention.checks import check_count
from attention_jax.attention.checks import check_finite
from attention_jax.attention.checks import check_flag
from attention_jax.attention.checks import check_lengths
from attention_jax.attention.checks import check_qkv
from attention_jax.attention.blocks import pad_to
from attention_jax.attention.heads import repeat_kv_heads
from attention_jax.attention.scores import DifferenceBias
from attention_jax.attention.scores import LinearBias
from attention_jax.attention.scores import one_of_each
from attention_jax.attention.segments import check_segment_ids
from attention_jax.attention.sink_logits import check_sinks
from attention_jax.attention.sink_logits import sink_gradient
from attention_jax.attention.soft_cap import check_soft_cap

STRATEGIES = ('scan', 'unrolled', 'auto')
# 'auto' unrolls up to this many queries and keys: the length up to which
# unrolling beats the scan on the 2-core CPU without a compile time out of
# proportion (benchmarks/README.md, "Chunked strategies").
UNROLLED_MAX_LENGTH = 2048
# Per strategy, the defaults of q_chunk and heads_per_step: the fastest on
# the 2-core CPU (benchmarks/README.md).
_DEFAULTS = {'scan': dict(q_chunk=512, heads_per_step=8),
             'unrolled': dict(q_chunk=128, heads_per_step=1)}


def _groups(x, g):
  """[N, ...] -> [N / g, g, ...]: the rows `lax.map` walks through g at a time."""
  return None if x is None else x.reshape(-1, g, *x.shape[1:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(10, 11, 12, 13, 14, 15, 16, 17))
def _chunked(q, k, v, kv_len, slopes, qv, kv, qs, ks, sink, strategy, causal, q_chunk,
             k_chunk, t_k, window, group, cap):
  out, _ = _chunked_fwd(q, k, v, kv_len, slopes, qv, kv, qs, ks, sink, strategy, causal,
                        q_chunk, k_chunk, t_k, window, group, cap)
  return out


def _options(strategy, causal, q_chunk, k_chunk, t_k, window, cap):
  options = dict(causal=causal, q_chunk=q_chunk, t_k=t_k, window=window, cap=cap)
  if strategy == 'scan':
    return blockwise_scan, dict(options, k_chunk=k_chunk)
  return blockwise_unrolled, options


def _chunked_fwd(q, k, v, kv_len, slopes, qv, kv, qs, ks, sink, strategy, causal, q_chunk,
                 k_chunk, t_k, window, group, cap):
  impl, options = _options(strategy, causal, q_chunk, k_chunk, t_k, window, cap)
  out, lse = jax.lax.map(lambda a: impl.forward_group(*a, **options),
                         tuple(_groups(x, group)
                               for x in (q, k, v, kv_len, slopes, qv, kv, qs, ks, sink)))
  out, lse = out.reshape(*q.shape[:2], v.shape[-1]), lse.reshape(q.shape[:2])
  return out, (q, k, v, kv_len, slopes, qv, kv, qs, ks, sink, out, lse)


def _chunked_bwd(strategy, causal, q_chunk, k_chunk, t_k, window, group, cap, residuals,
                 dout):
  q, k, v, kv_len, slopes, qv, kv, qs, ks, sink, out, lse = residuals
  impl, options = _options(strategy, causal, q_chunk, k_chunk, t_k, window, cap)
  dout = dout.astype(jnp.float32)
  delta = jnp.einsum('nqd,nqd->nq', dout, out)  # rowsum(dO ∘ O), [N, Tq']
  k_t = jnp.swapaxes(k, 1, 2)  # [N, D, Tk']: dQᵀ's operand, see blocks.backward_block
  args = (q, k, v, k_t, kv_len, slopes, qv, kv, qs, ks, delta, lse, dout)
  dq, dk, dv, dqv, dkv = jax.lax.map(lambda a: impl.backward_group(*a, **options),
                                     tuple(_groups(x, group) for x in args))
  flat = lambda g, like: None if like is None else g.reshape(like.shape)
  return (dq.reshape(q.shape).astype(q.dtype), dk.reshape(k.shape).astype(k.dtype),
          dv.reshape(v.shape).astype(v.dtype), None,
          None if slopes is None else jnp.zeros_like(slopes), flat(dqv, qv), flat(dkv, kv),
          None, None, None if sink is None else sink_gradient(sink, lse, delta))


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def choose_strategy(strategy: str, t_q: int, t_k: int) -> str:
  """'scan' or 'unrolled' for a call; 'auto' unrolls up to UNROLLED_MAX_LENGTH."""
  if strategy not in STRATEGIES:
    raise ValueError(f'strategy={strategy!r}; choose one of {STRATEGIES}.')
  if strategy == 'auto':
    return 'unrolled' if max(t_q, t_k) <= UNROLLED_MAX_LENGTH else 'scan'
  return strategy


def chunked_attention(
    q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, *, causal: bool = False,
    kv_lengths: Optional[jnp.ndarray] = None,
    alibi_slopes: Optional[jnp.ndarray] = None,
    difference: Optional[tuple[jnp.ndarray, jnp.ndarray]] = None,
    window: Optional[int] = None, strategy: str = 'auto', q_chunk: Optional[int] = None,
    k_chunk: int = 512, heads_per_step: Optional[int] = None,
    segment_ids: Optional[tuple[jnp.ndarray, jnp.ndarray]] = None,
    logit_soft_cap: Optional[float] = None,
    sinks: Optional[jnp.ndarray] = None) -> jnp.ndarray:
  """Exact attention without a T_q × T_k matrix; see the module docstring.

  Args:
    q, k, v: `[B, T_q, H, D]`, `[B, T_k, H_kv, D]`, `[B, T_k, H_kv, D_v]`;
      H_kv divides H (grouped-query attention, see `repeat_kv_heads`).
    causal: query i attends to keys j <= i.
    kv_lengths: optional int `[B]`: keys at positions >= kv_lengths[b] are
      padding. A query with no key left gets a zero output (and zero grads).
    alibi_slopes: optional `[H]`: adds ALiBi's `-slope_h · (i - j)` per block
      (treated as constants: no gradient flows to them).
    difference: optional (q_values `[B|1, T_q, H]`, k_values `[B|1, T_k, H]`):
      adds `q_values[b, i, h] - k_values[b, j, h]` per block (a
      `scores.DifferenceBias`'s values); gradients flow to both.
    window: optional int >= 1: query i attends only to keys j with
      |i - j| < window (indices); blocks outside the band are skipped.
    strategy: 'scan' | 'unrolled' | 'auto' (the module docstring).
    q_chunk: query block size; default 512 ('scan') or 128 ('unrolled').
    k_chunk: key block size of 'scan' ('unrolled' takes all visible keys).
    q_chunk and k_chunk are clipped to the lengths.
    heads_per_step: how many (example, head) rows each block step works on
      together (the largest divisor of B · H up to this); default 8 ('scan')
      or 1 ('unrolled'). Bounds a block's scores at heads_per_step × q_chunk
      × keys floats whatever the batch.
    segment_ids: optional int (q ids `[B, T_q]`, kv ids `[B, T_k]`): query i
      keeps key j only where the ids are equal (`segments.py`).
    logit_soft_cap: optional c > 0: each block's scores, biases added, become
      `c · tanh(s / c)` before the mask (`soft_cap.py`); the backward
      multiplies dS by 1 - tanh².
    sinks: optional float `[H]`, one learned sink logit per query head,
      joined to each row's running max and normaliser after its last key
      block (`sink_logits.py`); gradients flow to it.

  Returns:
    out `[B, T_q, H, D_v]` in the dtype of `v`. Attention weights are never
    formed; ask the dense path for them.
  """
  q, k, v = check_qkv(q, k, v, 'chunked_attention')
  (b, t_q, h, d), t_k = q.shape, k.shape[1]
  causal = check_flag('chunked_attention', 'causal', causal)
  for name, value in (('window', window), ('q_chunk', q_chunk), ('k_chunk', k_chunk),
                      ('heads_per_step', heads_per_step)):
    if value is not None:
      check_count('chunked_attention', name, value)
  kv_lengths = check_lengths('kv_lengths', kv_lengths, b, t_k)
  if segment_ids is not None:
    segment_ids = check_segment_ids(*segment_ids, b, t_q, t_k)
  strategy = choose_strategy(strategy, t_q, t_k)
  q_chunk = _DEFAULTS[strategy]['q_chunk'] if q_chunk is None else q_chunk
  heads_per_step = (_DEFAULTS[strategy]['heads_per_step'] if heads_per_step is None
                    else heads_per_step)
  k, v = repeat_kv_heads(k, v, h, q.shape)  # gradients sum back over each group
  if alibi_slopes is not None:
    alibi_slopes = check_array('alibi_slopes', alibi_slopes, kind='floating')
    check_finite('alibi_slopes', alibi_slopes)
    alibi_slopes = alibi_slopes.astype(jnp.float32)
    if alibi_slopes.shape != (h,):
      raise ValueError(f'alibi_slopes must have shape ({h},), got {alibi_slopes.shape}.')
  check_soft_cap(logit_soft_cap)
  sinks = check_sinks(sinks, h)
  check_finite('sinks', sinks)
  q_chunk, k_chunk = min(q_chunk, t_q), min(k_chunk, t_k)
  kv_lengths = (jnp.full((b,), t_k, jnp.int32) if kv_lengths is None
                else jnp.asarray(kv_lengths, jnp.int32))
  # One row per (example, head), [B · H, T, D]: every block is then a plain
  # slice, and the matmuls batch over the leading axis only.
  rows = lambda x: jnp.transpose(x, (0, 2, 1, 3)).reshape(b * h, x.shape[1], x.shape[3])
  q_r, k_r, v_r = pad_to(rows(q), 1, q_chunk), rows(k), rows(v)
  if strategy == 'scan':
    k_r, v_r = pad_to(k_r, 1, k_chunk), pad_to(v_r, 1, k_chunk)
  row_kv_len = jnp.repeat(kv_lengths, h)
  row_slopes = None if alibi_slopes is None else jnp.tile(alibi_slopes, b)
  row_sinks = None if sinks is None else jnp.tile(sinks, b)
  qv_r = kv_r = None
  if difference is not None:
    qv_r, kv_r = difference_rows(difference, b, h, t_q, t_k)
    qv_r = pad_to(qv_r, 1, q_chunk)
    if strategy == 'scan':
      kv_r = pad_to(kv_r, 1, k_chunk)
  qs_r = ks_r = None
  if segment_ids is not None:
    qs_r, ks_r = (_id_rows(x, h, t, chunk) for x, t, chunk in zip(
        segment_ids, (t_q, t_k), (q_chunk, k_chunk if strategy == 'scan' else 1)))
  group = math.gcd(b * h, heads_per_step)
  cap = None if logit_soft_cap is None else float(logit_soft_cap)
  out = _chunked(q_r, k_r, v_r, row_kv_len, row_slopes, qv_r, kv_r, qs_r, ks_r, row_sinks,
                 strategy, causal, q_chunk, k_chunk, t_k, window, group, cap)
  out = out[:, :t_q].reshape(b, h, t_q, -1)
  return jnp.transpose(out, (0, 2, 1, 3)).astype(v.dtype)


def _id_rows(ids, h: int, t: int, chunk: int):
  """Segment ids `[B, T]` -> int32 rows `[B · H, T']`, one per (example,
  head) like q's, padded to a multiple of `chunk` by repeating the last id
  (padded keys are masked anyway; the repeat keeps each block's id range
  tight for the scan's skipping)."""
  ids = jnp.repeat(jnp.asarray(ids, jnp.int32), h, axis=0)
  if ids.shape != (ids.shape[0], t):
    raise ValueError(f'segment ids {ids.shape} do not match the length {t}.')
  pad = -t % chunk
  return jnp.pad(ids, ((0, 0), (0, pad)), mode='edge') if pad else ids


def chunked_kernel(q, k, v, *, mask, scores, causal, window, kv_lengths, return_weights,
                   normalization=None, q_slots=None, chunk_size=None,
                   chunked_strategy='auto', segment_ids=None, logit_soft_cap=None,
                   sinks=None):
  """The 'chunked' row of `dispatch.KERNELS`: structure, segment ids (with
  softmax), and of the score specs a `LinearBias` and a `DifferenceBias`
  only, no weights; softmax (with the soft cap and sink logits if given), or
  stick-breaking
  (`blockwise_stick_breaking.py`, causal) when normalization is a
  `StickBreaking`. The dispatcher sends nothing else.
  -> (out `[B, T_q, H, D_v]`, None)."""
  if mask is not None or return_weights or q_slots is not None:
    raise ValueError('chunked_kernel takes no dense mask or q_slots and forms no weights.')
  linear, difference = one_of_each(scores, (LinearBias, DifferenceBias), 'chunked_kernel')
  slopes = None if linear is None else linear.slopes
  chunks = {} if chunk_size is None else dict(q_chunk=chunk_size, k_chunk=chunk_size)
  values = None if difference is None else (difference.q_values, difference.k_values)
  if normalization is not None:
    if segment_ids is not None:
      raise ValueError('chunked_kernel: stick-breaking with segment ids is not built '
                       'blockwise; the dispatcher sends them to the dense kernel.')
    if logit_soft_cap is not None or sinks is not None:
      raise ValueError('chunked_kernel: logit_soft_cap and sinks act on a softmax only.')
    out = chunked_stick_breaking(
        q, k, v, kv_lengths=kv_lengths, alibi_slopes=slopes, difference=values,
        window=window, attend_current=normalization.attend_current,
        remainder=normalization.remainder, **chunks)
    return out, None
  out = chunked_attention(q, k, v, causal=causal, kv_lengths=kv_lengths,
                          alibi_slopes=slopes, difference=values, window=window,
                          strategy=chunked_strategy, segment_ids=segment_ids,
                          logit_soft_cap=logit_soft_cap, sinks=sinks, **chunks)
  return out, None
