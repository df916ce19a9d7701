"""Our flash-attention kernel for TPU (Pallas on Mosaic), with the position
bias built inside the kernel from its spec (`pallas_blocks.py`): ALiBi's
slopes, forgetting attention's difference bias, hard windows on token
indices or position ids, causal, window and padding. Forward and backward,
O(T) memory: no T_q × T_k array exists anywhere.

The grid is (batch, head, query block, key block) with the key blocks the
sequential ("arbitrary") axis: each step adds one tile to a running max,
normaliser and output kept in VMEM scratch (FlashAttention-2). The backward
is two kernels of the same shape: dK, dV (and the key side of a difference
bias) walking query blocks per key block, and dQ (and the query side)
walking key blocks per query block, both recomputing each tile's
probabilities from the row log-sum-exp. Tiles that the structure (causal,
window, padding) leaves empty are skipped.

Grouped-query attention reads the shared key/value head through the index
map; its dK and dV come out per query head and are summed over each group.

On CPU it runs in Pallas' TPU interpret mode (`interpret=True`, or inside
`jax.experimental.pallas.tpu.force_tpu_interpret_mode()`): the tests check
its numerics there and its lowering with `jax.export(platforms=('tpu',))`.
That proves what Mosaic is given, not that it compiles or how fast it runs:
benchmarks/tpu.sh measures that on a TPU.

Shapes: q `[B, T_q, H, D]`, k `[B, T_k, H_kv, D]`, v `[B, T_k, H_kv, D_v]`.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from attention_jax.attention import pallas_blocks as pb
from attention_jax.attention.scores import DifferenceBias
from attention_jax.attention.scores import MASK_VALUE
from attention_jax.attention.scores import WindowBias
from attention_jax.attention.sink_logits import check_sinks
from attention_jax.attention.sink_logits import join_sink
from attention_jax.attention.sink_logits import sink_gradient

BLOCK = 128  # query and key rows per tile: one MXU pass on every TPU generation
# The scalars prefetched to SMEM: slopes, lows, highs, kv_len, sink logits.
N_SCALARS = 5
_NT = (((1,), (1,)), ((), ()))  # a · bᵀ
_TN = (((0,), (0,)), ((), ()))  # aᵀ · b


def _dot(a, b, dims=(((1,), (0,)), ((), ()))):
  return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _operands(st, q_rows, k_rows):
  """The BlockSpecs of the optional side inputs, in the order `_tile` reads
  them: (q_values, k_values), (q ids, k ids), then (q and k segment ids).
  q_rows / k_rows map a grid index to (query block, key block)."""
  specs = []
  if st.difference:
    specs += [pl.BlockSpec((None, None, BLOCK, 1), lambda b, h, i, j, *_: (b, h, q_rows(i, j), 0)),
              pl.BlockSpec((None, None, 1, BLOCK), lambda b, h, i, j, *_: (b, h, 0, k_rows(i, j)))]
  for present in (st.positions, st.segments):
    if present:
      specs += [pl.BlockSpec((None, BLOCK, 1), lambda b, h, i, j, *_: (b, q_rows(i, j), 0)),
                pl.BlockSpec((None, 1, BLOCK), lambda b, h, i, j, *_: (b, 0, k_rows(i, j)))]
  return specs


def _side(st, refs):
  """Splits the optional side refs (see `_operands`) -> dict for `pb.tile`."""
  out, refs = {}, list(refs)
  if st.difference:
    out['qv'], out['kv'] = refs.pop(0)[...], refs.pop(0)[...]
  if st.positions:
    out['q_pos'], out['k_pos'] = refs.pop(0)[...], refs.pop(0)[...]
  if st.segments:
    out['q_seg'], out['k_seg'] = refs.pop(0)[...], refs.pop(0)[...]
  return out


def _n_side(st):
  return 2 * st.difference + 2 * st.positions + 2 * st.segments


def _tile(st, scalars, q, k, i, j, side):
  """Scores and keep of tile (query block i, key block j) of head h, example b."""
  slopes, lows, highs, kv_lens = scalars[:4]
  b, h = pl.program_id(0), pl.program_id(1)
  q_idx = pb.iota((BLOCK, 1), 0, i * BLOCK)
  k_idx = pb.iota((1, BLOCK), 1, j * BLOCK)
  s = _dot(q, k, _NT) * st.scale
  return pb.tile(s, q_idx, k_idx, kv_lens[b], st, slope=slopes[h], low=lows[h],
                 high=highs[h], **side)


def _forward_kernel(st, *refs):
  scalars, (q_ref, k_ref, v_ref), rest = (refs[:N_SCALARS], refs[N_SCALARS:N_SCALARS + 3],
                                          refs[N_SCALARS + 3:])
  side, (o_ref, lse_ref, m_ref, l_ref, acc_ref) = rest[:_n_side(st)], rest[_n_side(st):]
  i, j = pl.program_id(2), pl.program_id(3)

  @pl.when(j == 0)
  def _():
    m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

  @pl.when(pb.tile_may_keep(i * BLOCK, j * BLOCK, BLOCK, BLOCK,
                            scalars[3][pl.program_id(0)], st))
  def _():
    s, keep = _tile(st, scalars, q_ref[...], k_ref[...], i, j, _side(st, side))
    m_prev = m_ref[...]
    m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
    p = jnp.where(keep, jnp.exp(s - m_new), 0.0)
    correction = jnp.exp(m_prev - m_new)
    l_ref[...] = correction * l_ref[...] + p.sum(axis=1, keepdims=True)
    v = v_ref[...]
    acc_ref[...] = correction * acc_ref[...] + _dot(p.astype(v.dtype), v)
    m_ref[...] = m_new

  @pl.when(j == pl.num_programs(3) - 1)
  def _():
    m, l, acc = m_ref[...], l_ref[...], acc_ref[...]
    if st.sinks:
      m, l, acc = join_sink(m, l, acc, scalars[4][pl.program_id(1)])
    out, lse = pb.finish(m, l, acc)
    o_ref[...] = out.astype(o_ref.dtype)
    lse_ref[...] = lse


def _call(kernel, st, grid, in_specs, out_specs, out_shape, scratch, interpret):
  return pl.pallas_call(
      functools.partial(kernel, st), out_shape=out_shape,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=N_SCALARS, grid=grid, in_specs=in_specs, out_specs=out_specs,
          scratch_shapes=scratch),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=('parallel', 'parallel', 'parallel', 'arbitrary')),
      interpret=pltpu.InterpretParams() if interpret else False)


def _forward(st, group, interpret, scalars, q, k, v, side):
  b, h, t_q, d = q.shape
  t_k, d_v = k.shape[2], v.shape[3]
  grid = (b, h, t_q // BLOCK, t_k // BLOCK)
  kv_head = lambda hh: jax.lax.div(hh, group)  # jnp's // lowers via sign: asks for a TPU
  in_specs = [
      pl.BlockSpec((None, None, BLOCK, d), lambda b_, h_, i, j, *_: (b_, h_, i, 0)),
      pl.BlockSpec((None, None, BLOCK, d), lambda b_, h_, i, j, *_: (b_, kv_head(h_), j, 0)),
      pl.BlockSpec((None, None, BLOCK, d_v), lambda b_, h_, i, j, *_: (b_, kv_head(h_), j, 0)),
      *_operands(st, lambda i, j: i, lambda i, j: j)]
  out_specs = [pl.BlockSpec((None, None, BLOCK, d_v), lambda b_, h_, i, j, *_: (b_, h_, i, 0)),
               pl.BlockSpec((None, None, BLOCK, 1), lambda b_, h_, i, j, *_: (b_, h_, i, 0))]
  out_shape = [jax.ShapeDtypeStruct((b, h, t_q, d_v), v.dtype),
               jax.ShapeDtypeStruct((b, h, t_q, 1), jnp.float32)]
  scratch = [pltpu.VMEM((BLOCK, 1), jnp.float32), pltpu.VMEM((BLOCK, 1), jnp.float32),
             pltpu.VMEM((BLOCK, d_v), jnp.float32)]
  return _call(_forward_kernel, st, grid, in_specs, out_specs, out_shape, scratch,
               interpret)(*scalars, q, k, v, *side)


def _probabilities(st, scalars, q, k, v, do, lse, delta, i, j, side):
  """A tile's P, dS (both `[bq, bk]`, float32) recomputed from the row lse."""
  s, keep = _tile(st, scalars, q, k, i, j, side)
  p = jnp.where(keep, jnp.exp(s - lse), 0.0)
  dp = _dot(do, v, _NT)
  return p, pb.cap_slope(p * (dp - delta), s, keep, st)


def _dkv_kernel(st, *refs):
  scalars, (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref), rest = (
      refs[:N_SCALARS], refs[N_SCALARS:N_SCALARS + 6], refs[N_SCALARS + 6:])
  n = _n_side(st)
  side, outs = rest[:n], rest[n:]
  dk_ref, dv_ref = outs[0], outs[1]
  dkv_ref = outs[2] if st.difference else None
  dk_acc, dv_acc, dkv_acc = outs[-3:]
  j, i = pl.program_id(2), pl.program_id(3)  # key block, query block

  @pl.when(i == 0)
  def _():
    dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
    dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)
    dkv_acc[...] = jnp.zeros(dkv_acc.shape, jnp.float32)

  @pl.when(pb.tile_may_keep(i * BLOCK, j * BLOCK, BLOCK, BLOCK,
                            scalars[3][pl.program_id(0)], st))
  def _():
    q, do = q_ref[...], do_ref[...]
    p, ds = _probabilities(st, scalars, q, k_ref[...], v_ref[...], do, lse_ref[...],
                           delta_ref[...], i, j, _side(st, side))
    dv_acc[...] += _dot(p.astype(do.dtype), do, _TN)
    dk_acc[...] += _dot(ds.astype(q.dtype), q, _TN) * st.scale
    dkv_acc[...] -= ds.sum(axis=0, keepdims=True)

  @pl.when(i == pl.num_programs(3) - 1)
  def _():
    dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
    dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)
    if dkv_ref is not None:
      dkv_ref[...] = dkv_acc[...]


def _dq_kernel(st, *refs):
  scalars, (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref), rest = (
      refs[:N_SCALARS], refs[N_SCALARS:N_SCALARS + 6], refs[N_SCALARS + 6:])
  n = _n_side(st)
  side, outs = rest[:n], rest[n:]
  dq_ref = outs[0]
  dqv_ref = outs[1] if st.difference else None
  dq_acc, dqv_acc = outs[-2:]
  i, j = pl.program_id(2), pl.program_id(3)

  @pl.when(j == 0)
  def _():
    dq_acc[...] = jnp.zeros(dq_acc.shape, jnp.float32)
    dqv_acc[...] = jnp.zeros(dqv_acc.shape, jnp.float32)

  @pl.when(pb.tile_may_keep(i * BLOCK, j * BLOCK, BLOCK, BLOCK,
                            scalars[3][pl.program_id(0)], st))
  def _():
    k = k_ref[...]
    _, ds = _probabilities(st, scalars, q_ref[...], k, v_ref[...], do_ref[...],
                           lse_ref[...], delta_ref[...], i, j, _side(st, side))
    dq_acc[...] += _dot(ds.astype(k.dtype), k) * st.scale
    dqv_acc[...] += ds.sum(axis=1, keepdims=True)

  @pl.when(j == pl.num_programs(3) - 1)
  def _():
    dq_ref[...] = dq_acc[...].astype(dq_ref.dtype)
    if dqv_ref is not None:
      dqv_ref[...] = dqv_acc[...]


def _backward(st, group, interpret, scalars, q, k, v, side, out, lse, dout):
  b, h, t_q, d = q.shape
  t_k, d_v = k.shape[2], v.shape[3]
  delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), -1, keepdims=True)
  kv_head = lambda hh: jax.lax.div(hh, group)  # jnp's // lowers via sign: asks for a TPU
  row = lambda width, rows: pl.BlockSpec(
      (None, None, BLOCK, width), lambda b_, h_, x, y, *_: (b_, h_, rows(x, y), 0))
  kv_row = lambda width, rows: pl.BlockSpec(
      (None, None, BLOCK, width), lambda b_, h_, x, y, *_: (b_, kv_head(h_), rows(x, y), 0))
  args = (*scalars, q, k, v, dout, lse, delta, *side)
  # dK, dV: grid (b, h, key block j, query block i).
  qi, kj = (lambda x, y: y), (lambda x, y: x)
  in_specs = [row(d, qi), kv_row(d, kj), kv_row(d_v, kj), row(d_v, qi), row(1, qi),
              row(1, qi), *_operands(st, qi, kj)]
  out_specs = [row(d, kj), row(d_v, kj)]
  out_shape = [jax.ShapeDtypeStruct((b, h, t_k, d), k.dtype),
               jax.ShapeDtypeStruct((b, h, t_k, d_v), v.dtype)]
  if st.difference:
    out_specs.append(pl.BlockSpec((None, None, 1, BLOCK), lambda b_, h_, x, y, *_: (b_, h_, 0, x)))
    out_shape.append(jax.ShapeDtypeStruct((b, h, 1, t_k), jnp.float32))
  scratch = [pltpu.VMEM((BLOCK, d), jnp.float32), pltpu.VMEM((BLOCK, d_v), jnp.float32),
             pltpu.VMEM((1, BLOCK), jnp.float32)]
  dkv_out = _call(_dkv_kernel, st, (b, h, t_k // BLOCK, t_q // BLOCK), in_specs, out_specs,
                  out_shape, scratch, interpret)(*args)
  # dQ: grid (b, h, query block i, key block j).
  qi, kj = (lambda x, y: x), (lambda x, y: y)
  in_specs = [row(d, qi), kv_row(d, kj), kv_row(d_v, kj), row(d_v, qi), row(1, qi),
              row(1, qi), *_operands(st, qi, kj)]
  out_specs, out_shape = [row(d, qi)], [jax.ShapeDtypeStruct(q.shape, q.dtype)]
  if st.difference:
    out_specs.append(row(1, qi))
    out_shape.append(jax.ShapeDtypeStruct((b, h, t_q, 1), jnp.float32))
  scratch = [pltpu.VMEM((BLOCK, d), jnp.float32), pltpu.VMEM((BLOCK, 1), jnp.float32)]
  dq_out = _call(_dq_kernel, st, (b, h, t_q // BLOCK, t_k // BLOCK), in_specs, out_specs,
                 out_shape, scratch, interpret)(*args)
  dk, dv = (x.reshape(b, h // group, group, *x.shape[2:]).sum(2).astype(x.dtype)
            for x in dkv_out[:2])
  dside = [None] * len(side)
  if st.difference:
    dside[0], dside[1] = dq_out[1], dkv_out[2]
  dsinks = (sink_gradient(scalars[4][None], lse[..., 0], delta[..., 0]).sum(0) if st.sinks
            else None)
  return dq_out[0], dk, dv, dside, dsinks


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _flash(st, group, interpret, scalars, q, k, v, side):
  return _forward(st, group, interpret, scalars, q, k, v, side)[0]


def _flash_fwd(st, group, interpret, scalars, q, k, v, side):
  out, lse = _forward(st, group, interpret, scalars, q, k, v, side)
  return out, (scalars, q, k, v, side, out, lse)


def _flash_bwd(st, group, interpret, residuals, dout):
  scalars, q, k, v, side, out, lse = residuals
  dq, dk, dv, dside, dsinks = _backward(st, group, interpret, scalars, q, k, v, side, out,
                                        lse, dout)
  # No gradient to the per-head constants, the lengths or the position ids;
  # the sink logits' from the row lse.
  dside = tuple(None if g is None else g.reshape(x.shape) for x, g in zip(side, dside))
  return (None,) * 4 + (dsinks,), dq, dk, dv, dside


_flash.defvjp(_flash_fwd, _flash_bwd)


def pallas_tpu_attention(
    q, k, v, *, causal: bool = False, kv_lengths=None, window: Optional[int] = None,
    alibi_slopes=None, difference: Optional[DifferenceBias] = None,
    windows: Optional[WindowBias] = None, interpret: bool = False, segment_ids=None,
    logit_soft_cap: Optional[float] = None, sinks=None):
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
    interpret: run in Pallas' TPU interpret mode (CPU tests).
    segment_ids: optional int (q ids `[B, T_q]`, kv ids `[B, T_k]`): query i
      keeps key j only where they are equal (packed documents), masked per
      tile (a tile of documents that do not meet is computed, not skipped).
    logit_soft_cap: optional c > 0 (static): scores, biases added, become
      `c · tanh(s / c)` before the mask.
    sinks: optional float `[H]`: one learned sink logit per query head in
      the softmax's denominator, with gradients.

  Returns:
    out `[B, T_q, H, D_v]` in the dtype of v.
  """
  (b, t_q, h, d), t_k, h_kv = q.shape, k.shape[1], k.shape[2]
  if h % h_kv:
    raise ValueError(f'pallas_tpu_attention: H_kv={h_kv} key/value heads must divide '
                     f'H={h} query heads.')
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
  heads_first = lambda x: pb.pad_length(jnp.swapaxes(x, 1, 2), 2, BLOCK)
  qh, kh, vh = heads_first(q), heads_first(k), heads_first(v)
  side = []
  if st.difference:
    qv, kv = pb.row_values(difference, b, h, t_q, t_k)
    side += [pb.pad_length(qv[..., None], 2, BLOCK), pb.pad_length(kv[:, :, None], 3, BLOCK)]
  if st.positions:
    side += [pb.pad_length(q_ids[..., None], 1, BLOCK), pb.pad_length(k_ids[:, None], 2, BLOCK)]
  if st.segments:
    side += [pb.pad_length(q_seg[..., None], 1, BLOCK), pb.pad_length(k_seg[:, None], 2, BLOCK)]
  out = _flash(st, h // h_kv, interpret, (slopes, lows, highs, kv_len, sinks), qh, kh, vh,
               tuple(side))
  return jnp.swapaxes(out[:, :, :t_q], 1, 2)


# The 'pallas_tpu' row of `dispatch.KERNELS`.
pallas_tpu_kernel = pb.kernel_run(pallas_tpu_attention, 'pallas_tpu_kernel')
