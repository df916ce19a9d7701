"""What our Pallas kernels (`pallas_tpu.py`, `pallas_gpu.py`) share: the
score specs turned into small operands, and the math of one score tile that
builds the bias and the keep-mask inside the kernel from them.

No T_q × T_k array ever leaves a kernel: a tile's bias comes from O(T)
numbers, the same ones the chunked kernel uses (`blocks.py`):

* ALiBi's slopes (`LinearBias`): `-slope_h · (i - j)` on token indices;
* a `DifferenceBias`: `q_values[i] - k_values[j]` (forgetting attention);
* a `WindowBias`: `lows[h] <= p_i - p_j <= highs[h]` on position ids (or the
  token indices), or the sink `p_j == 0`; Hard-ALiBi and `windowed_rope` on
  coupled ids;
* structure: causal, `window` (|i - j| < window) and `kv_lengths`;
* segment ids (packed documents): query i keeps key j only where their ids
  are equal, from int32 ids `[B, T]` read per tile like position ids. Tiles
  are not skipped for them (which documents meet is data, the tile walk is
  structure): masked only;
* Gemma 2's logit soft cap on each tile's scores (a constant), and
  gpt-oss's sink logits `[H]` (read as a per-head scalar, joined to the
  running max and normaliser after the last key block; their gradient
  comes from the row lse outside the kernels, `sink_logits.sink_gradient`).

A `WindowBias` acts as part of the keep-mask here (weight exactly 0), where
the dense kernel adds MASK_VALUE: the two agree whenever a query has a
visible key inside its window, which both encodings that use it guarantee
(the diagonal p_i - p_i = 0 is inside every window). A query with no key
left gets a zero output and zero gradients, as on the other kernels.
"""

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.attention.scores import DifferenceBias
from attention_jax.attention.scores import LinearBias
from attention_jax.attention.scores import MASK_VALUE
from attention_jax.attention.scores import WindowBias
from attention_jax.attention.scores import one_of_each
from attention_jax.attention.segments import check_segment_ids
from attention_jax.attention.soft_cap import soft_cap
from attention_jax.attention.soft_cap import soft_cap_slope

# The bounds of a head without a window: far outside any i - j of int32 ids.
UNBOUNDED = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Structure:
  """The static part of a call (constants of the kernel): what is built in."""
  scale: float
  causal: bool
  window: Optional[int]  # |i - j| < window on token indices
  t_k: int  # the real number of keys (past it: the blocks' own padding)
  alibi: bool  # slopes given
  difference: bool  # q_values and k_values given
  windows: bool  # per-head lows/highs given
  positions: bool  # windows on position ids (else on token indices)
  sink: bool  # with windows: keys at id 0 always visible (WindowBias(sink=True))
  segments: bool = False  # q and k segment ids given (packed documents)
  cap: Optional[float] = None  # logit soft cap (`soft_cap.py`)
  sinks: bool = False  # learned sink logits given (`sink_logits.py`)


def head_scalars(num_heads: int, slopes, windows: Optional[WindowBias]):
  """-> float32 slopes `[H]` and int32 lows, highs `[H]` (zeros when unused):
  the per-head numbers a kernel reads from scalar memory."""
  s = np.zeros(num_heads, np.float32) if slopes is None else np.asarray(slopes, np.float32)
  lo = np.full(num_heads, -UNBOUNDED, np.int32)
  hi = np.full(num_heads, UNBOUNDED, np.int32)
  if windows is not None:
    lo[:] = [-UNBOUNDED if x is None else x for x in windows.lows]
    hi[:] = [UNBOUNDED if x is None else x for x in windows.highs]
  return jnp.asarray(s), jnp.asarray(lo), jnp.asarray(hi)


def row_values(difference: Optional[DifferenceBias], b: int, h: int, t_q: int, t_k: int):
  """float32 (q_values `[B, H, T_q]`, k_values `[B, H, T_k]`), heads first
  (from the spec's `[B|1, T, H]`), or (None, None)."""
  if difference is None:
    return None, None
  q, k = difference.heads_first()
  return jnp.broadcast_to(q, (b, h, t_q)), jnp.broadcast_to(k, (b, h, t_k))


def row_segments(segment_ids, b: int, t_q: int, t_k: int):
  """int32 (q ids `[B, T_q]`, kv ids `[B, T_k]`) of the call's segment ids
  (checked, `segments.check_segment_ids`), or (None, None)."""
  if segment_ids is None:
    return None, None
  return check_segment_ids(*segment_ids, b, t_q, t_k)


def row_positions(windows: Optional[WindowBias], b: int, t_q: int, t_k: int):
  """int32 (q ids `[B, T_q]`, k ids `[B, T_k]`) for windows on position ids,
  or (None, None) for windows on token indices or no windows."""
  if windows is None or (windows.q_positions is None and windows.k_positions is None):
    return None, None
  q, k = windows.positions(t_q, t_k)
  return jnp.broadcast_to(q, (b, t_q)), jnp.broadcast_to(k, (b, t_k))


def tile(s, q_idx, k_idx, kv_len, st: Structure, *, slope=None, qv=None, kv=None,
         q_pos=None, k_pos=None, low=None, high=None, q_seg=None, k_seg=None):
  """One tile's scores with the bias added, masked, and its keep-mask.

  Args:
    s: float32 `[bq, bk]`, q·k already scaled.
    q_idx, k_idx: int32 `[bq, 1]` and `[1, bk]`, the token indices.
    kv_len: int32 scalar, keys at or past it are padding.
    st: the `Structure`.
    slope: float32 scalar (with `st.alibi`).
    qv, kv: float32 `[bq, 1]` and `[1, bk]` (with `st.difference`).
    q_pos, k_pos: int32 `[bq, 1]` and `[1, bk]` (with `st.positions`).
    low, high: int32 scalars (with `st.windows`).
    q_seg, k_seg: int32 `[bq, 1]` and `[1, bk]` (with `st.segments`).

  Returns:
    (scores float32 `[bq, bk]`, soft-capped with `st.cap`, MASK_VALUE where
    not kept; keep bool `[bq, bk]`).
  """
  d = q_idx - k_idx
  if st.alibi:
    s = s - slope * d.astype(jnp.float32)
  if st.difference:
    s = s + (qv - kv)
  s = soft_cap(s, st.cap)
  keep = k_idx < jnp.minimum(kv_len, st.t_k)
  if st.causal:
    keep = keep & (d >= 0)
  if st.window is not None:
    keep = keep & (jnp.abs(d) < st.window)
  if st.windows:
    dp = (q_pos - k_pos) if st.positions else d
    inside = (dp >= low) & (dp <= high)
    if st.sink:
      inside = inside | ((k_pos if st.positions else k_idx) == 0)
    keep = keep & inside
  if st.segments:
    keep = keep & (q_seg == k_seg)
  return jnp.where(keep, s, MASK_VALUE), keep


def cap_slope(ds, s, keep, st: Structure):
  """dS `[bq, bk]` of the capped scores -> of the uncapped ones (times 1 -
  tanh², from the tile's capped scores `s`); unchanged without a cap."""
  return ds if st.cap is None else ds * soft_cap_slope(s, keep, st.cap)


def sink_scalars(num_heads: int, sinks):
  """float32 `[H]`: the sink logits, or zeros when unused (`st.sinks` off)."""
  return jnp.zeros((num_heads,), jnp.float32) if sinks is None else sinks


def tile_may_keep(q_start, k_start, bq: int, bk: int, kv_len, st: Structure):
  """Whether any key of the tile can be kept by the structure alone (causal,
  window, padding): the tiles a kernel may skip. Traced scalars in, bool out."""
  run = k_start < jnp.minimum(kv_len, st.t_k)
  if st.causal:
    run = run & (k_start <= q_start + bq - 1)
  if st.window is not None:
    run = run & (k_start + bk - 1 > q_start - st.window) & (k_start < q_start + bq - 1
                                                              + st.window)
  return run


def finish(m, l, acc):
  """Output and row log-sum-exp from the running max `m`, normaliser `l`
  (`[bq, 1]`) and unnormalised output `acc` `[bq, Dv]`: a row with no key
  kept (l == 0) gets zeros and lse = +inf, so the backward's exp(s - lse) is
  0 there."""
  empty = l == 0.0
  safe = jnp.where(empty, 1.0, l)
  out = jnp.where(empty, 0.0, acc / safe)
  lse = jnp.where(empty, jnp.inf, m + jnp.log(safe))
  return out, lse


def block_size(t: int, preferred: int) -> int:
  """A block of `preferred` rows, or the length rounded up to a multiple of 8
  when it is shorter (the arrays are padded to a multiple of the block)."""
  return preferred if t >= preferred else max(8, -(-t // 8) * 8)


def pad_length(x, axis: int, multiple: int, value=0):
  pad = -x.shape[axis] % multiple
  if not pad:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths, constant_values=value)


def iota(shape, dimension: int, start):
  """int32 indices `start + 0 … n-1` along `dimension` of a 2-D tile (TPU
  kernels need 2-D iotas)."""
  return start + jax.lax.broadcasted_iota(jnp.int32, shape, dimension)


def kernel_run(attention, name: str):
  """The `dispatch.KERNELS` run function of a Pallas kernel `attention(q, k,
  v, *, causal, kv_lengths, window, alibi_slopes, difference, windows,
  segment_ids, logit_soft_cap, sinks)`: structure, and of the score specs
  one each of `LinearBias`, `DifferenceBias` and `WindowBias`, all built in
  the kernel, segment ids, the soft cap and the sink logits too; softmax; no
  dense mask or bias, no weights (the dispatcher sends nothing else).
  -> (out `[B, T_q, H, D_v]`, None)."""

  def run(q, k, v, *, mask, scores, causal, window, kv_lengths, return_weights,
          normalization=None, segment_ids=None, logit_soft_cap=None, sinks=None,
          **unused_options):
    del unused_options  # other kernels' options (chunk sizes)
    if mask is not None or return_weights or normalization is not None:
      raise ValueError(f'{name} takes no dense mask, forms no weights and runs softmax '
                       'attention only.')
    linear, difference, windows = one_of_each(
        scores, (LinearBias, DifferenceBias, WindowBias), name)
    out = attention(q, k, v, causal=causal, kv_lengths=kv_lengths, window=window,
                    alibi_slopes=None if linear is None else linear.slopes,
                    difference=difference, windows=windows, segment_ids=segment_ids,
                    logit_soft_cap=logit_soft_cap, sinks=sinks)
    return out, None

  run.__name__, run.__module__ = name, attention.__module__
  return run
