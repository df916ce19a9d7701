"""One entry point over the three attention implementations, and 'auto'.

* 'dense'   (`dense.py`): any mask and bias, returns the weights; O(T²) memory.
* 'chunked' (`chunked.py`): blockwise, O(T) memory; masks and biases by
  structure only (causal, kv_lengths, window, ALiBi slopes); no weights.
* 'cudnn'   `jax.nn.dot_product_attention(implementation='cudnn')`: the fused
  GPU kernel (float16/bfloat16, head_dim a multiple of 8 up to 128); no
  weights. Its fully-masked rows follow jax.nn's convention, not ours (see
  `dense.py`); it exists for GPU speed, not for exactness tests.
* 'auto'    the fastest that can serve the call: 'cudnn' on a GPU when it can,
  else 'chunked' from `AUTO_CHUNKED_MIN_KEYS` keys on (where it beats dense
  on CPU, benchmarks/results/attention.md), else 'dense'. On CPU it never
  picks jax.nn's XLA path, whose backward is pathologically slow there.

Shapes: q `[B, T_q, H, D]`, k `[B, T_k, H_kv, D]`, v `[B, T_k, H_kv, D_v]`.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.attention.chunked import STRATEGIES
from attention_jax.attention.chunked import chunked_attention
from attention_jax.attention.dense import multi_head_attention
from attention_jax.attention.masks import causal_mask
from attention_jax.attention.masks import combine_masks
from attention_jax.attention.masks import sliding_window_mask

IMPLEMENTATIONS = ('dense', 'chunked', 'cudnn', 'auto')
# Chunked vs dense, causal layer fwd+bwd on the 2-core CPU (2026-11-30,
# benchmarks/results/attention.md and auto_threshold/, from
# benchmarks/attention.py): dense 1.17× faster at T = 128,
# chunked 1.11× faster at 256, 1.12× at 384, 1.16× at 512, 1.45× at 1024.
AUTO_CHUNKED_MIN_KEYS = 256


def select_implementation(requested: str, *, t_k: int, dtype, head_dim: int,
                          return_weights: bool, dense_mask: bool, dense_bias: bool,
                          chunked_obstacles: tuple[str, ...] = (),
                          backend: Optional[str] = None) -> str:
  """The implementation a call runs on; a clear error when `requested` is
  one that cannot serve it. `chunked_obstacles`: the caller's own reasons
  (e.g. an encoding's non-linear bias)."""
  if requested not in IMPLEMENTATIONS:
    raise ValueError(f'implementation={requested!r}; choose one of {IMPLEMENTATIONS}.')
  if requested == 'dense':
    return 'dense'
  backend = backend or jax.default_backend()
  no_weights = ['return_weights=True (only the dense path forms the weights)'] if return_weights else []
  chunked_no = no_weights + list(chunked_obstacles) + (
      ['a dense mask or bias (pass causal=, kv_lengths=, window= or ALiBi slopes instead)']
      if dense_mask or dense_bias else [])
  cudnn_no = list(no_weights)
  if backend != 'gpu':
    cudnn_no.append(f"a GPU (the default backend is {backend!r})")
  if jnp.dtype(dtype) not in (jnp.float16, jnp.bfloat16):
    cudnn_no.append(f'float16 or bfloat16 inputs (got {jnp.dtype(dtype).name})')
  if head_dim % 8 or head_dim > 128:
    cudnn_no.append(f'head_dim a multiple of 8 up to 128 (got {head_dim})')
  if requested in ('chunked', 'cudnn'):
    obstacles = chunked_no if requested == 'chunked' else cudnn_no
    if obstacles:
      raise ValueError(f'implementation={requested!r} cannot serve this call: '
                       + '; '.join(obstacles) + ". Use 'dense' or 'auto'.")
    return requested
  if not cudnn_no:
    return 'cudnn'
  if not chunked_no and t_k >= AUTO_CHUNKED_MIN_KEYS:
    return 'chunked'
  return 'dense'


def scaled_dot_product_attention(
    q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, *,
    mask: Optional[jnp.ndarray] = None, bias: Optional[jnp.ndarray] = None,
    causal: bool = False, kv_lengths: Optional[jnp.ndarray] = None,
    alibi_slopes=None, window: Optional[int] = None, implementation: str = 'auto',
    return_weights: bool = False, chunk_size: Optional[int] = None,
    chunked_strategy: str = 'auto',
) -> tuple[jnp.ndarray, Optional[jnp.ndarray]]:
  """Multi-head attention on any implementation (see the module docstring).

  Args:
    q, k, v: `[B, T_q, H, D]`, `[B, T_k, H_kv, D]`, `[B, T_k, H_kv, D_v]`.
    mask: boolean, broadcastable to `[B, H, T_q, T_k]`, True = attend.
    bias: additive, broadcastable to `[B, H, T_q, T_k]`.
    causal: query i attends to keys j <= i.
    kv_lengths: int `[B]`: keys at index >= kv_lengths[b] are padding.
    alibi_slopes: `[H]`: adds `-slope_h · (i - j)` (positions = indices).
    window: query i attends to keys with |i - j| < window.
    implementation: 'dense' | 'chunked' | 'cudnn' | 'auto'.
    return_weights: also return float32 `[B, H, T_q, T_k]` (dense only).
    chunk_size: query and key block size of the chunked path (default:
      `chunked_attention`'s, per strategy).
    chunked_strategy: 'scan' | 'unrolled' | 'auto', see `chunked_attention`.

  Returns:
    `(out [B, T_q, H, D_v], weights or None)`.
  """
  if chunked_strategy not in STRATEGIES:  # early, whichever implementation runs
    raise ValueError(f'chunked_strategy={chunked_strategy!r}; choose one of {STRATEGIES}.')
  t_q, t_k = q.shape[1], k.shape[1]
  impl = select_implementation(
      implementation, t_k=t_k, dtype=q.dtype, head_dim=q.shape[-1],
      return_weights=return_weights, dense_mask=mask is not None,
      dense_bias=bias is not None)
  if causal and t_q != t_k:
    raise ValueError(f'causal=True needs T_q == T_k, got {t_q} and {t_k}.')
  if impl == 'chunked':
    out = chunked_attention(q, k, v, causal=causal, kv_lengths=kv_lengths,
                            alibi_slopes=alibi_slopes, window=window,
                            strategy=chunked_strategy,
                            **({} if chunk_size is None
                               else dict(q_chunk=chunk_size, k_chunk=chunk_size)))
    return out, None
  if alibi_slopes is not None:
    distance = (np.arange(t_q)[:, None] - np.arange(t_k)[None, :]).astype(np.float32)
    alibi = -jnp.asarray(alibi_slopes, jnp.float32)[:, None, None] * distance
    bias = alibi if bias is None else bias.astype(jnp.float32) + alibi
  if impl == 'cudnn':
    out = jax.nn.dot_product_attention(
        q, k, v, bias=None if bias is None else bias.astype(q.dtype), mask=mask,
        is_causal=causal, key_value_seq_lengths=kv_lengths,
        local_window_size=None if window is None else (window - 1, window - 1),
        implementation='cudnn')
    return out, None
  if causal:
    mask = combine_masks(mask, causal_mask(t_q))
  if window is not None:
    mask = combine_masks(mask, sliding_window_mask(t_q, t_k, window))
  if kv_lengths is not None:
    keys = jnp.arange(t_k)[None, None, None, :]
    mask = combine_masks(mask, keys < jnp.asarray(kv_lengths)[:, None, None, None])
  out, weights = multi_head_attention(q, k, v, mask=mask, bias=bias)
  return out, (weights if return_weights else None)
