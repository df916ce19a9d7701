"""The 'splash' kernel: JAX's Pallas splash attention for TPU
(`jax.experimental.pallas.ops.tpu.splash_attention`), forward and backward.

Splash takes its mask as a static structure (a `Mask` object of NumPy
masks, processed into per-tile tables when the kernel object is built, at
trace time) and skips the tiles it leaves empty. So it serves structure
only: causal, a sliding window (causal: left only; else `|i - j| < window`),
key padding (as segment ids), the call's segment ids (its `SegmentIds`, with
padded keys given an id no query has), grouped-query attention (its MHA
kernel reads head `h // (H / H_kv)`); softmax, no bias, no dense mask, no
weights. Both
lengths must be multiples of `LENGTH_MULTIPLE` (a tile is 128 rows at
least).

Splash does not scale the scores: q is multiplied by 1/√D first (in q's
dtype). A query row with no key to attend gets a zero output (and zero
gradients), as in `dense.py`. Splash has Gemma 2's logit soft cap
(`attn_logits_soft_cap`, on q·k of the scaled q, then the mask: ours, with
no bias here) and gpt-oss's sink logits (`sinks`, one per query head, in
its running max and denominator) built in: the row serves both.

Also the shared plumbing of the TPU rows (`tpu_flash.py` too): tile sizes
chosen from the lengths, padding as segment ids, rows with no key.

On CPU both run interpreted (`interpret=True`): the tests check their
numerics there and their lowering with `jax.export(platforms=('tpu',))`,
not that Mosaic compiles them or how fast they run on a TPU. Splash runs one
kernel per example (`jax.vmap`), so it takes Pallas' generic interpreter
(`pallas_call(interpret=True)`): TPU interpret mode
(`pltpu.force_tpu_interpret_mode()`) refuses a vmapped kernel's extra grid
axis.

Shapes: q `[B, T_q, H, D]`, k `[B, T_k, H_kv, D]`, v `[B, T_k, H_kv, D_v]`.
"""

import math
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

# Both TPU kernels tile the lengths by multiples of the 128 lanes of a vreg.
LENGTH_MULTIPLE = 128
# Tried largest first: the biggest tile that divides the length, for fewer
# grid steps (a 512 × 512 float32 tile of scores is 1 MiB of VMEM). Not tuned
# on a TPU: no TPU has run these rows yet.
_BLOCKS = (512, 256, 128)


def block_for(length: int, block_size: Optional[int] = None) -> int:
  """The tile size along a length: `block_size` if given, else the largest of
  512, 256, 128 that divides it. Refuses a length (or block) it cannot tile."""
  if length % LENGTH_MULTIPLE:
    raise ValueError(f'length {length}: the TPU kernels need a multiple of '
                     f'{LENGTH_MULTIPLE}.')
  if block_size is not None:
    if block_size % LENGTH_MULTIPLE or length % block_size:
      raise ValueError(f'block_size={block_size}: use a multiple of {LENGTH_MULTIPLE} '
                       f'that divides the length {length}.')
    return block_size
  return next(b for b in _BLOCKS if length % b == 0)


def kv_segments(kv_lengths, b: int, t_q: int, t_k: int):
  """Key padding as segment ids: (q ids `[B, T_q]`, kv ids `[B, T_k]`), int32,
  every query in segment 1 and padded keys in segment 0; None without
  kv_lengths."""
  if kv_lengths is None:
    return None
  lengths = jnp.asarray(kv_lengths, jnp.int32).reshape(b, 1)
  return (jnp.ones((b, t_q), jnp.int32),
          (jnp.arange(t_k)[None, :] < lengths).astype(jnp.int32))


# The id of a padded key when the call also has segment ids: no query's
# (real ids are >= 0, `segments.PADDED_QUERY` is -1).
_NO_QUERY = int(jnp.iinfo(jnp.int32).min)


def segment_rows_with_keys(q_ids, kv_ids, *, causal: bool, window: Optional[int],
                           kv_lengths) -> jnp.ndarray:
  """Boolean `[B, T_q]`: which queries have a key of their own segment to
  attend, exactly, one block of `LENGTH_MULTIPLE` queries at a time (the
  ids' comparisons are O(T_q · T_k), never stored at once). Splash averages
  the masked keys of an empty row; dense.py gives it zeros."""
  (b, t_q), t_k = q_ids.shape, kv_ids.shape[1]
  keys = jnp.arange(t_k)[None, None, :]
  limit = (jnp.full((b,), t_k, jnp.int32) if kv_lengths is None
           else jnp.asarray(kv_lengths, jnp.int32))[:, None, None]

  def block(start):
    q = jax.lax.dynamic_slice_in_dim(q_ids, start, LENGTH_MULTIPLE, axis=1)
    i = start + jnp.arange(LENGTH_MULTIPLE)[None, :, None]
    keep = (q[:, :, None] == kv_ids[:, None, :]) & (keys < limit)
    if causal:
      keep = keep & (keys <= i)
    if window is not None:
      keep = keep & (jnp.abs(i - keys) < window)
    return keep.any(-1)

  found = jax.lax.map(block, jnp.arange(0, t_q, LENGTH_MULTIPLE))  # [n, B, 128]
  return jnp.moveaxis(found, 0, 1).reshape(b, t_q)


def rows_with_keys(b: int, t_q: int, t_k: int, *, causal: bool, window: Optional[int],
                   kv_lengths) -> Optional[jnp.ndarray]:
  """Boolean `[B, T_q]`: which queries have at least one key to attend (None:
  all do). Query i sees the keys j in [lo_i, hi_i): lo_i = max(i - window +
  1, 0) (0 without a window), hi_i = the least of T_k, kv_lengths[b] and
  i + 1 (causal) or i + window. The kernels would average the masked keys of
  an empty row; dense.py gives it zeros."""
  if kv_lengths is None and (window is None or causal or t_q <= t_k):
    return None  # every row keeps its diagonal key, or every key
  i = jnp.arange(t_q)[None, :]
  lo = jnp.zeros_like(i) if window is None else jnp.maximum(i - window + 1, 0)
  hi = i + 1 if causal else (jnp.full_like(i, t_k) if window is None else i + window)
  hi = jnp.minimum(hi, t_k)
  if kv_lengths is not None:
    hi = jnp.minimum(hi, jnp.asarray(kv_lengths, jnp.int32).reshape(b, 1))
  return jnp.broadcast_to(lo < hi, (b, t_q))


def zero_empty_rows(out, has_key):
  """out `[B, T_q, H, D_v]` with the rows of no key set to 0 (their
  cotangent too, so the kernel's backward sees none)."""
  return out if has_key is None else jnp.where(has_key[:, :, None, None], out, 0)


def _splash(t_q: int, t_k: int, heads: int, causal: bool, window: Optional[int],
            block_q: int, block_kv: int, interpret: bool, cap: Optional[float] = None):
  """The kernel object for one static structure, built at trace time (its
  tables become constants of the trace; splash caches the NumPy walk over the
  tiles by mask)."""
  shape = (t_q, t_k)
  if window is not None:
    one = sm.LocalMask(shape, (window - 1, 0 if causal else window - 1), offset=0)
  elif causal:
    one = sm.CausalMask(shape)
  else:
    one = sm.FullMask(shape)
  blocks = sk.BlockSizes(
      block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
      block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv,
      block_q_dq=block_q, block_kv_dq=block_kv)
  return sk.make_splash_mha(
      sm.MultiHeadMask([one] * heads), block_sizes=blocks, head_shards=1,
      q_seq_shards=1, interpret=interpret, attn_logits_soft_cap=cap)


def splash_kernel(q, k, v, *, mask, scores, causal, window, kv_lengths, return_weights,
                  normalization=None, q_slots=None, interpret: bool = False,
                  block_size: Optional[int] = None, segment_ids=None,
                  logit_soft_cap: Optional[float] = None, sinks=None, **unused_options):
  """The 'splash' row of `dispatch.KERNELS`: structure only, segment ids
  (int32 (q ids `[B, T_q]`, kv ids `[B, T_k]`) or None; module docstring),
  and splash's own soft cap and sink logits; the dispatcher sends nothing
  else. `interpret`: run in Pallas' generic interpreter (CPU tests);
  `block_size`: the query and key tile (default: `block_for`).
  `logit_soft_cap`: c > 0, splash's `attn_logits_soft_cap`; `sinks`: float
  `[H]`, splash's `sinks`. -> (out `[B, T_q, H, D_v]` in v's dtype, None)."""
  del unused_options  # other kernels' options (chunk sizes)
  if any(x is not None for x in (mask, normalization, q_slots)) or scores or return_weights:
    raise ValueError('splash_kernel takes no mask, score spec or q_slots, forms no weights '
                     'and runs softmax attention only.')
  (b, t_q, h, d), (t_k, h_kv) = q.shape, k.shape[1:3]
  if h % h_kv or v.shape[2] != h_kv:
    raise ValueError(f'incompatible heads: q {q.shape}, k {k.shape}, v {v.shape}; '
                     'H_kv must divide H.')
  kernel = _splash(t_q, t_k, h, causal, window, block_for(t_q, block_size),
                   block_for(t_k, block_size), interpret,
                   None if logit_soft_cap is None else float(logit_soft_cap))
  sinks = None if sinks is None else jnp.asarray(sinks, jnp.float32)
  heads_first = lambda x: jnp.transpose(x, (0, 2, 1, 3))  # [B, H, T, D]
  q_scaled = (q * (1.0 / math.sqrt(d))).astype(q.dtype)
  args = [heads_first(q_scaled), heads_first(k), heads_first(v)]
  if segment_ids is None:
    segments = kv_segments(kv_lengths, b, t_q, t_k)
    has_key = rows_with_keys(b, t_q, t_k, causal=causal, window=window,
                             kv_lengths=kv_lengths)
  else:
    q_ids, kv_ids = segment_ids
    if kv_lengths is not None:
      padded = jnp.arange(t_k)[None, :] >= jnp.asarray(kv_lengths, jnp.int32)[:, None]
      kv_ids = jnp.where(padded, _NO_QUERY, kv_ids)
    segments = (q_ids, kv_ids)
    has_key = segment_rows_with_keys(q_ids, kv_ids, causal=causal, window=window,
                                     kv_lengths=kv_lengths)
  if segments is None:
    out = jax.vmap(lambda q, k, v: kernel(q, k, v, sinks=sinks))(*args)
  else:
    out = jax.vmap(lambda q, k, v, qs, ks: kernel(
        q, k, v, segment_ids=sk.SegmentIds(qs, ks), sinks=sinks))(*args, *segments)
  out = heads_first(out).astype(v.dtype)
  return zero_empty_rows(out, has_key), None
