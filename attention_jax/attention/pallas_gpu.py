"""Our flash-attention kernel for GPU (Pallas on Triton), with the position
bias built inside the kernel from its spec (`pallas_blocks.py`): ALiBi's
slopes, forgetting attention's difference bias, hard windows on token
indices or position ids, causal, window and padding. Forward and backward,
O(T) memory: no T_q × T_k array exists anywhere.

The grid is (query block, batch, head) of parallel programs; each program
reads its rows of q, k and v from full-length refs and walks the key blocks
in a `fori_loop`, keeping a running max, normaliser and output in registers
(FlashAttention-2). The backward is two kernels of the same shape: dK, dV
(and the key side of a difference bias) walking query blocks per key block,
and dQ (and the query side) walking key blocks per query block, both
recomputing each tile's probabilities from the row log-sum-exp. The loops
run only over the blocks the structure (causal, window, padding) can keep:
`tile_may_keep` turned into a range of blocks.

Grouped-query attention reads the shared key/value head through the index
map; its dK and dV come out per query head, in float32, and are summed
over each group. The head dimension is padded with zeros to a power of two
and the lengths to a multiple of the blocks, as Triton's tiles need.

On CPU it runs in Pallas' interpret mode (`interpret=True`): the tests check
its numerics there and its lowering with `jax.export(platforms=('cuda',))`.
That proves what Triton is given, not that it compiles, fits the registers
or how fast it runs: that needs a GPU.

Shapes: q `[B, T_q, H, D]`, k `[B, T_k, H_kv, D]`, v `[B, T_k, H_kv, D_v]`.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from attention_jax.attention import pallas_blocks as pb
from attention_jax.attention.scores import DifferenceBias
from attention_jax.attention.scores import MASK_VALUE
from attention_jax.attention.scores import WindowBias
from attention_jax.attention.sink_logits import check_sinks
from attention_jax.attention.sink_logits import join_sink
from attention_jax.attention.sink_logits import sink_gradient

MIN_BLOCK = 16  # Triton's dot needs every tile dimension >= 16
# The per-head and per-example scalars each kernel reads first: slopes,
# lows, highs, kv_len, sink logits.
N_SCALARS = 5
_NT = (((1,), (1,)), ((), ()))  # a · bᵀ
_TN = (((0,), (0,)), ((), ()))  # aᵀ · b


def _dot(a, b, dims=(((1,), (0,)), ((), ()))):
  return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _cdiv(x, n: int):
  """ceil(x / n) for a traced int x >= 0 (Triton's integer division truncates)."""
  return jax.lax.div(x + (n - 1), n)


def key_blocks(q_start, bq: int, bk: int, kv_len, st: pb.Structure):
  """The key blocks [lo, hi) that the query block at q_start may see: the
  blocks `pb.tile_may_keep` keeps, which form one range."""
  lo = jnp.int32(0)
  hi = _cdiv(jnp.maximum(jnp.minimum(kv_len, st.t_k), 0), bk)
  if st.causal:
    hi = jnp.minimum(hi, jax.lax.div(q_start + bq - 1, bk) + 1)
  if st.window is not None:
    hi = jnp.minimum(hi, _cdiv(q_start + bq - 1 + st.window, bk))
    lo = _cdiv(jnp.maximum(q_start - st.window - bk + 2, 0), bk)
  return lo, hi


def query_blocks(k_start, bk: int, bq: int, n_q: int, kv_len, st: pb.Structure):
  """The query blocks [lo, hi) of n_q that may see the key block at k_start."""
  lo = jnp.int32(0)
  hi = jnp.where(k_start < jnp.minimum(kv_len, st.t_k), n_q, 0).astype(jnp.int32)
  if st.causal:
    lo = jax.lax.div(k_start, bq)
  if st.window is not None:
    hi = jnp.minimum(hi, _cdiv(k_start + bk - 1 + st.window, bq))
    lo = jnp.maximum(lo, _cdiv(jnp.maximum(k_start - bq + 2 - st.window, 0), bq))
  return lo, hi


def _n_side(st):
  return 2 * st.difference + 2 * st.positions + 2 * st.segments


def _rows(st, side, start, size, query: bool):
  """A block's entries for `pb.tile` from the full-length side refs
  (q_values, k_values, q ids, k ids, q and k segment ids, as present): the
  query side's as `[size, 1]`, or the key side's as `[1, size]`."""
  names = ((('qv', 'kv') if st.difference else ()) + (('q_pos', 'k_pos') if st.positions else ())
           + (('q_seg', 'k_seg') if st.segments else ()))
  out = {}
  for name, ref in zip(names, side):
    if name.startswith('q') == query:
      x = ref[pl.ds(start, size)]
      out[name] = x[:, None] if query else x[None, :]
  return out


def _tile(st, scalars, q, k, q_start, k_start, q_side, k_side):
  """Scores and keep of the tile of q `[bq, D]` at q_start, k `[bk, D]` at k_start."""
  slope, low, high, kv_len = scalars[:4]
  q_idx = pb.iota((q.shape[0], 1), 0, q_start)
  k_idx = pb.iota((1, k.shape[0]), 1, k_start)
  return pb.tile(_dot(q, k, _NT) * st.scale, q_idx, k_idx, kv_len, st, slope=slope,
                 low=low, high=high, **q_side, **k_side)


def _forward_kernel(st, bq, bk, *refs):
  scalars = tuple(r[...] for r in refs[:N_SCALARS])
  (q_ref, k_ref, v_ref), rest = refs[N_SCALARS:N_SCALARS + 3], refs[N_SCALARS + 3:]
  side, (o_ref, lse_ref) = rest[:_n_side(st)], rest[_n_side(st):]
  q_start = pl.program_id(0) * bq
  q = q_ref[pl.ds(q_start, bq), :]
  q_side = _rows(st, side, q_start, bq, query=True)

  def body(j, carry):
    acc, m_prev, l_prev = carry
    k_start = j * bk
    s, keep = _tile(st, scalars, q, k_ref[pl.ds(k_start, bk), :], q_start, k_start,
                    q_side, _rows(st, side, k_start, bk, query=False))
    m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
    p = jnp.where(keep, jnp.exp(s - m_new), 0.0)
    correction = jnp.exp(m_prev - m_new)
    v = v_ref[pl.ds(k_start, bk), :]
    return (correction * acc + _dot(p.astype(v.dtype), v), m_new,
            correction * l_prev + p.sum(axis=1, keepdims=True))

  lo, hi = key_blocks(q_start, bq, bk, scalars[3], st)
  init = (jnp.zeros((bq, v_ref.shape[-1]), jnp.float32),
          jnp.full((bq, 1), MASK_VALUE, jnp.float32), jnp.zeros((bq, 1), jnp.float32))
  acc, m, l = jax.lax.fori_loop(lo, hi, body, init)
  if st.sinks:
    m, l, acc = join_sink(m, l, acc, scalars[4])
  out, lse = pb.finish(m, l, acc)
  o_ref[...] = out.astype(o_ref.dtype)
  lse_ref[...] = lse.reshape(bq)


def _dkv_kernel(st, bq, bk, *refs):
  scalars = tuple(r[...] for r in refs[:N_SCALARS])
  (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref), rest = (refs[N_SCALARS:N_SCALARS + 6],
                                                             refs[N_SCALARS + 6:])
  side, outs = rest[:_n_side(st)], rest[_n_side(st):]
  k_start = pl.program_id(0) * bk
  k, v = k_ref[pl.ds(k_start, bk), :], v_ref[pl.ds(k_start, bk), :]
  k_side = _rows(st, side, k_start, bk, query=False)

  def body(i, carry):
    dk, dv, dkv = carry
    q_start = i * bq
    rows = pl.ds(q_start, bq)
    q, do = q_ref[rows, :], do_ref[rows, :]
    s, keep = _tile(st, scalars, q, k, q_start, k_start,
                    _rows(st, side, q_start, bq, query=True), k_side)
    p = jnp.where(keep, jnp.exp(s - lse_ref[rows][:, None]), 0.0)
    ds = pb.cap_slope(p * (_dot(do, v, _NT) - delta_ref[rows][:, None]), s, keep, st)
    dv = dv + _dot(p.astype(do.dtype), do, _TN)
    dk = dk + _dot(ds.astype(q.dtype), q, _TN) * st.scale
    if st.difference:
      dkv = dkv - ds.sum(axis=0, keepdims=True)
    return dk, dv, dkv

  lo, hi = query_blocks(k_start, bk, bq, q_ref.shape[0] // bq, scalars[3], st)
  init = (jnp.zeros((bk, k_ref.shape[-1]), jnp.float32),
          jnp.zeros((bk, v_ref.shape[-1]), jnp.float32), jnp.zeros((1, bk), jnp.float32))
  dk, dv, dkv = jax.lax.fori_loop(lo, hi, body, init)
  outs[0][...] = dk.astype(outs[0].dtype)
  outs[1][...] = dv.astype(outs[1].dtype)
  if st.difference:
    outs[2][...] = dkv.reshape(bk)


def _dq_kernel(st, bq, bk, *refs):
  scalars = tuple(r[...] for r in refs[:N_SCALARS])
  (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref), rest = (refs[N_SCALARS:N_SCALARS + 6],
                                                             refs[N_SCALARS + 6:])
  side, outs = rest[:_n_side(st)], rest[_n_side(st):]
  q_start = pl.program_id(0) * bq
  rows = pl.ds(q_start, bq)
  q, do = q_ref[rows, :], do_ref[rows, :]
  lse, delta = lse_ref[rows][:, None], delta_ref[rows][:, None]
  q_side = _rows(st, side, q_start, bq, query=True)

  def body(j, carry):
    dq, dqv = carry
    k_start = j * bk
    k, v = k_ref[pl.ds(k_start, bk), :], v_ref[pl.ds(k_start, bk), :]
    s, keep = _tile(st, scalars, q, k, q_start, k_start, q_side,
                    _rows(st, side, k_start, bk, query=False))
    p = jnp.where(keep, jnp.exp(s - lse), 0.0)
    ds = pb.cap_slope(p * (_dot(do, v, _NT) - delta), s, keep, st)
    dq = dq + _dot(ds.astype(k.dtype), k) * st.scale
    if st.difference:
      dqv = dqv + ds.sum(axis=1, keepdims=True)
    return dq, dqv

  lo, hi = key_blocks(q_start, bq, bk, scalars[3], st)
  init = (jnp.zeros((bq, q_ref.shape[-1]), jnp.float32), jnp.zeros((bq, 1), jnp.float32))
  dq, dqv = jax.lax.fori_loop(lo, hi, body, init)
  outs[0][...] = dq.astype(outs[0].dtype)
  if st.difference:
    outs[1][...] = dqv.reshape(bq)


def _specs(st, group, q, k, v, *rows):
  """BlockSpecs for a grid (block, b, h) of the scalars, q, k, v, `rows`
  (dO, q-like; lse and delta, `[B, H, T_q]`) and the side operands: whole
  rows of each (example, head), sliced inside the kernel."""
  t_q, t_k = q.shape[1], k.shape[1]
  seq = lambda a, heads: pl.BlockSpec(
      (None, a.shape[1], None, a.shape[3]), lambda x, b, h: (b, 0, heads(h), 0))
  per_head = lambda t: pl.BlockSpec((None, None, t), lambda x, b, h: (b, h, 0))
  per_example = lambda t: pl.BlockSpec((None, t), lambda x, b, h: (b, 0))
  query_head, kv_head = (lambda h: h), (lambda h: h // group)
  specs = [pl.BlockSpec((None,), lambda x, b, h: (h,))] * 3
  specs += [pl.BlockSpec((None,), lambda x, b, h: (b,)),
            pl.BlockSpec((None,), lambda x, b, h: (h,)),
            seq(q, query_head), seq(k, kv_head), seq(v, kv_head)]
  specs += [seq(a, query_head) if a.ndim == 4 else per_head(t_q) for a in rows]
  if st.difference:
    specs += [per_head(t_q), per_head(t_k)]
  if st.positions:
    specs += [per_example(t_q), per_example(t_k)]
  if st.segments:
    specs += [per_example(t_q), per_example(t_k)]
  return specs


def _block_out(width, block, rows=True):
  """The output block of a grid (block, b, h): `[block, width]` rows of a
  `[B, T, H, width]` array, or (rows=False) a `[block]` row of `[B, H, T]`."""
  if rows:
    return pl.BlockSpec((None, block, None, width), lambda x, b, h: (b, x, h, 0))
  return pl.BlockSpec((None, None, block), lambda x, b, h: (b, h, x))


def _call(kernel, st, blocks, grid, specs, outs, interpret, name):
  d = max(s.shape[-1] for s, _ in outs)
  return pl.pallas_call(
      functools.partial(kernel, st, *blocks), grid=grid, in_specs=specs,
      out_specs=[o for _, o in outs], out_shape=[s for s, _ in outs],
      interpret=interpret, name=name,
      compiler_params=plgpu.CompilerParams(num_warps=4 if d <= 64 else 8, num_stages=2))


def _forward(st, group, blocks, interpret, scalars, q, k, v, side):
  (b, t_q, h, _), d_v, (bq, _) = q.shape, v.shape[3], blocks
  outs = [(jax.ShapeDtypeStruct((b, t_q, h, d_v), v.dtype), _block_out(d_v, bq)),
          (jax.ShapeDtypeStruct((b, h, t_q), jnp.float32), _block_out(1, bq, rows=False))]
  return _call(_forward_kernel, st, blocks, (t_q // bq, b, h), _specs(st, group, q, k, v),
               outs, interpret, 'attention_forward')(*scalars, q, k, v, *side)


def _backward(st, group, blocks, interpret, scalars, q, k, v, side, out, lse, dout):
  (b, t_q, h, d), (t_k, d_v), (bq, bk) = q.shape, k.shape[1::2], blocks
  delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), -1).swapaxes(1, 2)
  specs = _specs(st, group, q, k, v, dout, lse, delta)
  args = (*scalars, q, k, v, dout, lse, delta, *side)
  # Per query head: float32 when a group's heads are summed after.
  dtype = lambda x: x.dtype if group == 1 else jnp.float32
  outs = [(jax.ShapeDtypeStruct((b, t_k, h, d), dtype(k)), _block_out(d, bk)),
          (jax.ShapeDtypeStruct((b, t_k, h, d_v), dtype(v)), _block_out(d_v, bk))]
  if st.difference:
    outs.append((jax.ShapeDtypeStruct((b, h, t_k), jnp.float32), _block_out(1, bk, False)))
  dkv_out = _call(_dkv_kernel, st, blocks, (t_k // bk, b, h), specs, outs, interpret,
                  'attention_dkv')(*args)
  outs = [(jax.ShapeDtypeStruct(q.shape, q.dtype), _block_out(d, bq))]
  if st.difference:
    outs.append((jax.ShapeDtypeStruct((b, h, t_q), jnp.float32), _block_out(1, bq, False)))
  dq_out = _call(_dq_kernel, st, blocks, (t_q // bq, b, h), specs, outs, interpret,
                 'attention_dq')(*args)
  dk, dv = (x.reshape(b, t_k, h // group, group, x.shape[3]).sum(3).astype(y.dtype)
            for x, y in zip(dkv_out[:2], (k, v)))
  dside = [None] * len(side)
  if st.difference:
    dside[0], dside[1] = dq_out[1], dkv_out[2]
  dsinks = sink_gradient(scalars[4][None], lse, delta).sum(0) if st.sinks else None
  return dq_out[0], dk, dv, dside, dsinks


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _flash(st, group, blocks, interpret, scalars, q, k, v, side):
  return _forward(st, group, blocks, interpret, scalars, q, k, v, side)[0]


def _flash_fwd(st, group, blocks, interpret, scalars, q, k, v, side):
  out, lse = _forward(st, group, blocks, interpret, scalars, q, k, v, side)
  return out, (scalars, q, k, v, side, out, lse)


def _flash_bwd(st, group, blocks, interpret, residuals, dout):
  scalars, q, k, v, side, out, lse = residuals
  dq, dk, dv, dside, dsinks = _backward(st, group, blocks, interpret, scalars, q, k, v,
                                        side, out, lse, dout)
  # No gradient to the per-head constants, the lengths or the position ids;
  # the sink logits' from the row lse.
  return (None,) * 4 + (dsinks,), dq, dk, dv, tuple(dside)


_flash.defvjp(_flash_fwd, _flash_bwd)


def _block(name: str, preferred: int, t: int) -> int:
  if preferred < MIN_BLOCK or preferred & (preferred - 1):
    raise ValueError(f'pallas_gpu_attention: {name}={preferred!r}; use a power of two '
                     f'>= {MIN_BLOCK}.')
  return min(preferred, max(MIN_BLOCK, pl.next_power_of_2(t)))


def pallas_gpu_attention(
    q, k, v, *, causal: bool = False, kv_lengths=None, window: Optional[int] = None,
    alibi_slopes=None, difference: Optional[DifferenceBias] = None,
    windows: Optional[WindowBias] = None, interpret: bool = False, block_q: int = 64,
    block_k: int = 64, segment_ids=None, logit_soft_cap: Optional[float] = None,
    sinks=None):
  """Exact attention with the bias built in the kernel (module docstring).

  Args:
    q, k, v: `[B, T_q, H, D]`, `[B, T_k, H_kv, D]`, `[B, T_k, H_kv, D_v]`,
      H_kv dividing H.
    causal: query i attends to keys j <= i (token indices).
    kv_lengths: optional int `[B]`: keys at index >= kv_lengths[b] are padding.
    window: optional int >= 1: |i - j| < window.
    alibi_slopes: optional floats `[H]` (static): adds `-slope_h · (i - j)`.
    difference: optional `DifferenceBias` (`[B|1, T_q, H]`, `[B|1, T_k, H]`):
      adds `q_values[i] - k_values[j]`, with gradients to both.
    windows: optional `WindowBias`: per-head windows on position ids.
    interpret: run in Pallas' interpret mode (CPU tests).
    block_q, block_k: query and key rows per tile, powers of two >= 16
      (shorter sequences take one block of their length rounded up).
    segment_ids: optional int (q ids `[B, T_q]`, kv ids `[B, T_k]`): query i
      keeps key j only where they are equal (packed documents), masked per
      tile.
    logit_soft_cap: optional c > 0 (static): scores, biases added, become
      `c · tanh(s / c)` before the mask.
    sinks: optional float `[H]`: one learned sink logit per query head in
      the softmax's denominator, with gradients.

  Returns:
    out `[B, T_q, H, D_v]` in the dtype of v.
  """
  (b, t_q, h, d), t_k, h_kv = q.shape, k.shape[1], k.shape[2]
  if h % h_kv:
    raise ValueError(f'pallas_gpu_attention: H_kv={h_kv} key/value heads must divide '
                     f'H={h} query heads.')
  blocks = (_block('block_q', block_q, t_q), _block('block_k', block_k, t_k))
  q_ids, k_ids = pb.row_positions(windows, b, t_q, t_k)
  q_seg, k_seg = pb.row_segments(segment_ids, b, t_q, t_k)
  st = pb.Structure(scale=d ** -0.5, causal=causal, window=window, t_k=t_k,
                    alibi=alibi_slopes is not None, difference=difference is not None,
                    windows=windows is not None, positions=q_ids is not None,
                    sink=bool(windows is not None and windows.sink),
                    segments=q_seg is not None,
                    cap=None if logit_soft_cap is None else float(logit_soft_cap),
                    sinks=sinks is not None)
  slopes, lows, highs = pb.head_scalars(h, alibi_slopes, windows)
  sinks = pb.sink_scalars(h, check_sinks(sinks, h))
  kv_len = (jnp.full((b,), t_k, jnp.int32) if kv_lengths is None
            else jnp.asarray(kv_lengths, jnp.int32))
  # Zero columns change no dot product; zero rows past the lengths are masked.
  pad = lambda x, block: pb.pad_length(
      pb.pad_length(x, 3, pl.next_power_of_2(x.shape[3])), 1, block)
  qp, kp, vp = pad(q, blocks[0]), pad(k, blocks[1]), pad(v, blocks[1])
  side = []
  if st.difference:
    qv, kv = pb.row_values(difference, b, h, t_q, t_k)
    side += [pb.pad_length(qv, 2, blocks[0]), pb.pad_length(kv, 2, blocks[1])]
  if st.positions:
    side += [pb.pad_length(q_ids, 1, blocks[0]), pb.pad_length(k_ids, 1, blocks[1])]
  if st.segments:
    side += [pb.pad_length(q_seg, 1, blocks[0]), pb.pad_length(k_seg, 1, blocks[1])]
  out = _flash(st, h // h_kv, blocks, interpret, (slopes, lows, highs, kv_len, sinks), qp,
               kp, vp, tuple(side))
  return out[:, :t_q, :, :v.shape[3]]


# The 'pallas_gpu' row of `dispatch.KERNELS`.
pallas_gpu_kernel = pb.kernel_run(pallas_gpu_attention, 'pallas_gpu_kernel')
