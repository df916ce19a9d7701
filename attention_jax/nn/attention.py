"""Flax NNX attention modules: parameters around the pure functions.

`SelfAttention` is lesson 7.2 (one head, W_Q/W_K/W_V); `MultiHeadAttention`
is lesson 7.3 (W_Q, W_K, W_V, W_O over `num_heads` heads). Their projection
kernels have the layout of `flax.nnx.MultiHeadAttention` (query/key/value
`[d_model, H, D]`, out `[H, D, d_model]`), so weights move between the two.

A positional encoding (a name from the registry or a `PositionalEncoding`)
acts here through its in-attention hooks: RoPE rotates q and k, ALiBi adds its
bias. Absolute encodings act on the embeddings, before attention, and are
no-ops here.
"""

from typing import Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention import multi_head_attention
from attention_jax.attention import scaled_dot_product_attention
from attention_jax.attention import select_implementation
from attention_jax.attention.chunked import STRATEGIES
from attention_jax.attention.dispatch import IMPLEMENTATIONS
from attention_jax.positional import NoPE
from attention_jax.positional import PositionalEncoding
from attention_jax.positional import make_encoding

Positional = Union[str, PositionalEncoding, None]


def _resolve_positional(encoding: Positional, *, d_model, num_heads,
                        max_positions, causal, rngs) -> PositionalEncoding:
  if encoding is None:
    return NoPE()
  if isinstance(encoding, str):
    return make_encoding(encoding, d_model=d_model, num_heads=num_heads,
                         max_positions=max_positions, causal=causal, rngs=rngs)
  if not isinstance(encoding, PositionalEncoding):
    raise TypeError(
        'encoding must be a registry name, a PositionalEncoding or None, '
        f'got {type(encoding).__name__}.')
  return encoding


def _is_arange(positions) -> bool:
  """Static positions 0 … T-1 (what linear biases and the chunked path assume)."""
  return (isinstance(positions, np.ndarray) and positions.ndim == 1
          and np.array_equal(positions, np.arange(len(positions))))


def _add_biases(*biases):
  biases = [b for b in biases if b is not None]
  if not biases:
    return None
  return sum(biases[1:], biases[0].astype(jnp.float32))


class MultiHeadAttention(nnx.Module):
  """Multi-head attention, lesson 7.3: `concat(head_1 … head_H) W_O`.

  Args:
    d_model: model width; inputs and outputs are `[B, T, d_model]`.
    num_heads: heads; must divide `d_model` (head_dim = d_model // num_heads).
    num_kv_heads: key/value heads, dividing `num_heads`; default `num_heads`.
      Fewer is grouped-query attention, 1 is multi-query attention: smaller
      W_K/W_V and a cache `num_heads / num_kv_heads` times smaller.
    sliding_window: if set, a query attends only to the `sliding_window`
      nearest keys on each side (|i - j| < window, token indices); with
      `causal=True` at call time, the `sliding_window` latest tokens.
    encoding: encoding acting inside attention (see module docstring).
    max_positions, causal: passed to the encoding when built from a name.
    use_bias: biases on the four projections (Flax's default is True).
    dtype, param_dtype: computation and parameter dtypes of the projections.
    implementation: 'dense' (weights available, any mask or bias), 'chunked'
      (blockwise, O(T) memory; masks only through `causal`/`kv_lengths`,
      biases only linear ones like causal ALiBi; no weights), 'cudnn' (GPU,
      half precision) or 'auto' (the fastest that can serve the call; see
      `attention.dispatch`).
    chunk_size: query and key block size of the chunked path (default:
      `chunked_attention`'s, per strategy).
    chunked_strategy: 'scan' | 'unrolled' | 'auto' (`chunked_attention`).
    rngs: `nnx.Rngs` for the parameters.
  """

  def __init__(self, d_model: int, num_heads: int, *, encoding: Positional = None,
               num_kv_heads: Optional[int] = None,
               sliding_window: Optional[int] = None,
               max_positions: Optional[int] = None, causal: bool = True,
               use_bias: bool = False, dtype=None, param_dtype=jnp.float32,
               implementation: str = 'dense', chunk_size: Optional[int] = None,
               chunked_strategy: str = 'auto',
               rngs: nnx.Rngs):
    if num_heads < 1 or d_model % num_heads:
      raise ValueError(
          f'num_heads={num_heads} must be >= 1 and divide d_model={d_model}.')
    if implementation not in IMPLEMENTATIONS:
      raise ValueError(
          f'implementation={implementation!r}; choose one of {IMPLEMENTATIONS}.')
    if chunked_strategy not in STRATEGIES:
      raise ValueError(
          f'chunked_strategy={chunked_strategy!r}; choose one of {STRATEGIES}.')
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if num_kv_heads < 1 or num_heads % num_kv_heads:
      raise ValueError(f'num_kv_heads={num_kv_heads} must be >= 1 and divide '
                       f'num_heads={num_heads}.')
    if sliding_window is not None and (not isinstance(sliding_window, int)
                                       or sliding_window < 1):
      raise ValueError(f'sliding_window={sliding_window!r}: use an integer >= 1 or None.')
    self.implementation, self.chunk_size = implementation, chunk_size
    self.chunked_strategy = chunked_strategy
    self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
    self.sliding_window = sliding_window
    self.head_dim = d_model // num_heads
    heads = (num_heads, self.head_dim)
    proj = dict(use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.W_Q = nnx.LinearGeneral(d_model, heads, **proj)
    self.W_K = nnx.LinearGeneral(d_model, (num_kv_heads, self.head_dim), **proj)
    self.W_V = nnx.LinearGeneral(d_model, (num_kv_heads, self.head_dim), **proj)
    self.W_O = nnx.LinearGeneral(heads, d_model, axis=(-2, -1), **proj)
    self.positional = _resolve_positional(
        encoding, d_model=d_model, num_heads=num_heads,
        max_positions=max_positions, causal=causal, rngs=rngs)

  def __call__(self, x: jnp.ndarray, context: Optional[jnp.ndarray] = None, *,
               mask: Optional[jnp.ndarray] = None,
               bias: Optional[jnp.ndarray] = None,
               positions: Optional[jnp.ndarray] = None,
               context_positions: Optional[jnp.ndarray] = None,
               causal: bool = False, kv_lengths: Optional[jnp.ndarray] = None,
               return_weights: bool = True):
    """Self-attention over `x`, or cross-attention from `x` to `context`.

    Args:
      x: queries' inputs `[B, T_q, d_model]`.
      context: keys'/values' inputs `[B, T_k, d_model]`; default `x`.
      mask: boolean, broadcastable to `[B, H, T_q, T_k]`, True = attend.
      bias: additive, broadcastable to `[B, H, T_q, T_k]`.
      positions: integer `[T_q]` or `[B, T_q]`; default `0 … T_q-1`.
      context_positions: for the keys; default `positions` for
        self-attention, `0 … T_k-1` for cross-attention.
      causal: query i attends to keys j <= i (combined with `mask`).
      kv_lengths: int `[B]`: keys at positions >= kv_lengths[b] are padding.
      return_weights: return the attention weights (dense path only).

    Returns:
      `(out, weights)`: `[B, T_q, d_model]` and float32 `[B, H, T_q, T_k]`
      (None when `return_weights` is False).
    """
    self_attention = context is None
    context = x if self_attention else context
    for name, a in (('x', x), ('context', context)):
      if a.ndim != 3 or a.shape[-1] != self.d_model:
        raise ValueError(
            f'{name} must be [batch, length, {self.d_model}], got {a.shape}.')
    if positions is None:
      positions = np.arange(x.shape[1], dtype=np.int32)
    if context_positions is None:
      context_positions = (positions if self_attention
                           else np.arange(context.shape[1], dtype=np.int32))
    q, k, v = self.W_Q(x), self.W_K(context), self.W_V(context)
    q, k = self.positional.rotate_queries_keys(q, k, positions, context_positions)
    enc = self.positional
    default_positions = _is_arange(positions) and _is_arange(context_positions)
    slopes = enc.linear_bias_slopes() if default_positions else None
    obstacles = []
    if enc.has_attention_bias and enc.linear_bias_slopes() is None:
      obstacles.append(f'the bias of {type(enc).__name__}, which is not linear in i - j')
    elif enc.has_attention_bias and slopes is None:
      obstacles.append('a position bias with positions other than the default 0 … T-1')
    impl = select_implementation(
        self.implementation, t_k=context.shape[1], dtype=q.dtype, head_dim=self.head_dim,
        return_weights=return_weights, dense_mask=mask is not None,
        dense_bias=bias is not None, chunked_obstacles=tuple(obstacles))
    if impl == 'chunked':
      enc_bias = None  # ALiBi rebuilt block by block from its slopes
    else:
      enc_bias, slopes = enc.attention_bias(positions, context_positions), None
    out, weights = scaled_dot_product_attention(
        q, k, v, mask=mask, bias=_add_biases(bias, enc_bias), causal=causal,
        kv_lengths=kv_lengths, alibi_slopes=slopes, window=self.sliding_window,
        implementation=impl, return_weights=return_weights, chunk_size=self.chunk_size,
        chunked_strategy=self.chunked_strategy)
    return self.W_O(out), weights

  def init_cache(self, batch_size: int, cache_size: int, dtype=jnp.float32) -> dict:
    """An empty cache for `extend`: key/value `[B, cache_size, H_kv, D]`
    (rotated keys when the encoding rotates) and their int32 positions `[B, cache_size]`."""
    shape = (batch_size, cache_size, self.num_kv_heads, self.head_dim)
    return dict(key=jnp.zeros(shape, dtype), value=jnp.zeros(shape, dtype),
                positions=jnp.zeros((batch_size, cache_size), jnp.int32))

  def extend(self, x: jnp.ndarray, cache: dict, start, *,
             positions: Optional[jnp.ndarray] = None) -> tuple[jnp.ndarray, dict]:
    """Causal self-attention of S new tokens over themselves and the cache.

    The tokens take cache slots `start … start+S-1` (`start` may be traced);
    each attends to slots at or before its own (and inside the sliding
    window). Prefill is one call with S = prompt length, decoding one call
    per token with S = 1; either way the outputs equal the full causal pass.

    Args:
      x: `[B, S, d_model]`.
      cache: from `init_cache` or a previous `extend`.
      start: first slot written, an int or int32 scalar.
      positions: int `[S]` or `[B, S]` for the encoding; default the slots.

    Returns:
      `(out [B, S, d_model], cache)` with the new keys, values and positions.
    """
    check_cache_slots(start, x.shape[1], cache['key'].shape[1])
    return self._extend(x, cache, start, positions=positions)

  def _extend(self, x, cache, start, *, positions=None):
    """`extend` without the slot check, for callers that guarantee the range."""
    (b, s_len, _), t_max = x.shape, cache['key'].shape[1]
    slots = start + jnp.arange(s_len, dtype=jnp.int32)
    if positions is None:
      positions = slots
    positions = jnp.broadcast_to(jnp.asarray(positions, jnp.int32), (b, s_len))
    q, k, v = self.W_Q(x), self.W_K(x), self.W_V(x)
    q, k = self.positional.rotate_queries_keys(q, k, positions, positions)
    write = lambda buf, new: jax.lax.dynamic_update_slice_in_dim(
        buf, new.astype(buf.dtype), start, axis=1)
    cache = dict(key=write(cache['key'], k), value=write(cache['value'], v),
                 positions=write(cache['positions'], positions))
    keys = jnp.arange(t_max)[None, :]
    mask = keys <= slots[:, None]  # causal; also hides the slots not yet written
    if self.sliding_window is not None:
      mask = mask & (slots[:, None] - keys < self.sliding_window)
    bias = self.positional.attention_bias(positions, cache['positions'])
    out, _ = multi_head_attention(q, cache['key'].astype(q.dtype),
                                  cache['value'].astype(v.dtype), mask=mask, bias=bias)
    return self.W_O(out), cache


def _raise_if_past_cache(start, s_len, t_max) -> None:
  if int(start) < 0 or int(start) + s_len > t_max:
    raise ValueError(f'extend writes cache slots {int(start)} … {int(start) + s_len - 1} '
                     f'but the cache has {t_max} slots (0 … {t_max - 1}); '
                     'make it longer with init_cache(cache_size=...).')


def check_cache_slots(start, s_len: int, t_max: int) -> None:
  """Past-the-end writes are an error (dynamic_update_slice would silently
  shift them): at trace time for a Python int, at run time when traced."""
  if isinstance(start, (int, np.integer)):
    _raise_if_past_cache(start, s_len, t_max)
  else:
    jax.debug.callback(_raise_if_past_cache, start, s_len, t_max)


class SelfAttention(nnx.Module):
  """Single-head self-attention, lesson 7.2: `softmax(QKᵀ/√d_k) V`.

  Args:
    d_model: input width; inputs are `[B, T, d_model]`.
    d_k: width of queries and keys (and values unless `d_v` is given).
    d_v: width of values and of the output; default `d_k`.
    encoding: encoding acting inside attention ('rope', 'alibi', …).
    max_positions, causal: passed to the encoding when built from a name.
    rngs: `nnx.Rngs` for the parameters.
  """

  def __init__(self, d_model: int, d_k: int, *, d_v: Optional[int] = None,
               encoding: Positional = None, max_positions: Optional[int] = None,
               causal: bool = True, dtype=None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    proj = dict(use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.d_model = d_model
    self.W_Q = nnx.Linear(d_model, d_k, **proj)
    self.W_K = nnx.Linear(d_model, d_k, **proj)
    self.W_V = nnx.Linear(d_model, d_v or d_k, **proj)
    self.positional = _resolve_positional(
        encoding, d_model=d_k, num_heads=1, max_positions=max_positions,
        causal=causal, rngs=rngs)

  def __call__(self, x: jnp.ndarray, *, mask: Optional[jnp.ndarray] = None,
               bias: Optional[jnp.ndarray] = None,
               positions: Optional[jnp.ndarray] = None):
    """x `[B, T, d_model]`; mask/bias broadcastable to `[B, T, T]`; positions
    `[T]` or `[B, T]` -> `(out [B, T, d_v], weights float32 [B, T, T])`."""
    if x.ndim != 3 or x.shape[-1] != self.d_model:
      raise ValueError(f'x must be [batch, length, {self.d_model}], got {x.shape}.')
    if positions is None:
      positions = np.arange(x.shape[1], dtype=np.int32)
    # One head: a head axis of size 1 lets the multi-head path do the work.
    q, k, v = (w(x)[:, :, None, :] for w in (self.W_Q, self.W_K, self.W_V))
    q, k = self.positional.rotate_queries_keys(q, k, positions, positions)
    head_axis = lambda a: a if a is None or a.ndim < 3 else a[..., None, :, :]
    bias = _add_biases(head_axis(bias), self.positional.attention_bias(positions, positions))
    out, weights = multi_head_attention(q, k, v, mask=head_axis(mask), bias=bias)
    return out[:, :, 0, :], weights[:, 0]
