"""The 'tpu_flash' kernel: JAX's Pallas flash attention for TPU
(`jax.experimental.pallas.ops.tpu.flash_attention`), forward and backward,
with gradients to a dense bias.

It takes a bias of the full `[B, H, T_q, T_k]` shape (`ab`) and adds it
before the scale: its scores are `(q kᵀ + ab) · sm_scale`. Ours are
`q kᵀ / √D + bias`, so it gets `ab = bias · √D` and `sm_scale = 1/√D`
(q itself is not rounded to a scaled copy). It serves a dense bias (broadcast
to the full shape in memory), and any other score spec (linear, difference,
windows) materialised: O(T²) memory in the bias, where 'chunked' builds a linear or
difference bias block by block. Also causal and key padding (as segment
ids); grouped-query attention by repeating the key/value heads. No window,
no dense mask, no weights; D_v == D; lengths multiples of 128 (see
`splash.py`, whose plumbing it shares).

The kernel adds its causal and padding mask value (-0.7 · float32 max) on
top of the bias: a bias is floored at `_BIAS_FLOOR` first so that the sum
stays finite (a key that far below is ignored all the same).

`fa.flash_attention` takes neither a logit soft cap nor sink logits (splash
does), so the row refuses `logit_soft_cap=` and `sinks=`.

`jax.experimental.pallas.ops.tpu.flash_attention` takes no `interpret=`:
with `interpret=True` both its forward and its backward are traced under
`pltpu.force_tpu_interpret_mode()` (`_interpreted`).

Shapes: q `[B, T_q, H, D]`, k `[B, T_k, H_kv, D]`, v `[B, T_k, H_kv, D]`.
"""

import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as fa

from attention_jax.attention.heads import repeat_kv_heads
from attention_jax.attention.scores import materialise
from attention_jax.attention.splash import block_for
from attention_jax.attention.splash import kv_segments
from attention_jax.attention.splash import rows_with_keys
from attention_jax.attention.splash import zero_empty_rows

_BIAS_FLOOR = -0.1 * float(jnp.finfo(jnp.float32).max)


def _interpreted(fn):
  """fn(q, k, v, ab, segments) with its forward and its backward both traced
  under TPU interpret mode (the backward is traced after `fn` returns, out of
  any `with` around the call)."""
  @jax.custom_vjp
  def run(q, k, v, ab, segments):
    with pltpu.force_tpu_interpret_mode():
      return fn(q, k, v, ab, segments)

  def run_fwd(q, k, v, ab, segments):
    with pltpu.force_tpu_interpret_mode():
      out, vjp = jax.vjp(lambda q, k, v, ab: fn(q, k, v, ab, segments), q, k, v, ab)
    return out, vjp

  def run_bwd(vjp, dout):
    with pltpu.force_tpu_interpret_mode():
      return (*vjp(dout), None)

  run.defvjp(run_fwd, run_bwd)
  return run


def _flash(q, k, v, ab, segments, *, causal, sm_scale, block_sizes):
  ids = None if segments is None else fa.SegmentIds(*segments)
  return fa.flash_attention(q, k, v, ab, ids, causal=causal, sm_scale=sm_scale,
                            block_sizes=block_sizes)


def tpu_flash_kernel(q, k, v, *, mask, scores, causal, window, kv_lengths, return_weights,
                     normalization=None, q_slots=None, interpret: bool = False,
                     block_size: Optional[int] = None, **unused_options):
  """The 'tpu_flash' row of `dispatch.KERNELS` (module docstring): scores a
  tuple of score specs, all materialised. `interpret`: run in Pallas' TPU
  interpret mode (CPU tests); `block_size`: the query and key tile (default:
  `splash.block_for`). -> (out `[B, T_q, H, D]` in v's dtype, None)."""
  del unused_options  # other kernels' options (chunk sizes)
  if (mask is not None or window is not None or normalization is not None
      or q_slots is not None or return_weights):
    raise ValueError('tpu_flash_kernel takes no mask, window or q_slots, forms no '
                     'weights and runs softmax attention only.')
  (b, t_q, h, d), t_k = q.shape, k.shape[1]
  if v.shape[-1] != d:
    raise ValueError(f'tpu_flash_kernel needs D_v == D, got q {q.shape} and v {v.shape}.')
  k, v = repeat_kv_heads(k, v, h, q.shape)  # gradients sum back over each group
  bias = materialise(scores, t_q, t_k)
  if bias is not None:
    bias = jnp.broadcast_to(bias.astype(jnp.float32), (b, h, t_q, t_k))
    bias = jnp.maximum(bias * math.sqrt(d), _BIAS_FLOOR)
  bq, bk = block_for(t_q, block_size), block_for(t_k, block_size)
  blocks = fa.BlockSizes(
      block_q=bq, block_k_major=bk, block_k=bk, block_b=1,
      block_q_major_dkv=bq, block_k_major_dkv=bk, block_k_dkv=bk, block_q_dkv=bq,
      block_k_major_dq=bk, block_k_dq=bk, block_q_dq=bq)
  run = functools.partial(_flash, causal=causal, sm_scale=1.0 / math.sqrt(d),
                          block_sizes=blocks)
  if interpret:
    run = _interpreted(run)
  heads_first = lambda x: jnp.transpose(x, (0, 2, 1, 3))  # [B, H, T, D]
  out = run(heads_first(q), heads_first(k), heads_first(v), bias,
            kv_segments(kv_lengths, b, t_q, t_k))
  out = heads_first(out).astype(v.dtype)
  has_key = rows_with_keys(b, t_q, t_k, causal=causal, window=None, kv_lengths=kv_lengths)
  return zero_empty_rows(out, has_key), None
