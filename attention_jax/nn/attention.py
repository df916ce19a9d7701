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

import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention import causal_mask
from attention_jax.attention import chunked_attention
from attention_jax.attention import combine_masks
from attention_jax.attention import multi_head_attention
from attention_jax.positional import NoPE
from attention_jax.positional import PositionalEncoding
from attention_jax.positional import make_encoding

Positional = Union[str, PositionalEncoding, None]
IMPLEMENTATIONS = ('dense', 'chunked', 'auto')


def _resolve_positional(positional: Positional, *, d_model, num_heads,
                        max_length, causal, rngs) -> PositionalEncoding:
  if positional is None:
    return NoPE()
  if isinstance(positional, str):
    return make_encoding(positional, d_model=d_model, num_heads=num_heads,
                         max_length=max_length, causal=causal, rngs=rngs)
  if not isinstance(positional, PositionalEncoding):
    raise TypeError(
        'positional must be an encoding name, a PositionalEncoding or None, '
        f'got {type(positional).__name__}.')
  return positional


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
    positional: encoding acting inside attention (see module docstring).
    max_length, causal: passed to the encoding when built from a name.
    use_bias: biases on the four projections (Flax's default is True).
    dtype, param_dtype: computation and parameter dtypes of the projections.
    implementation: 'dense' (weights available, any mask or bias), 'chunked'
      (blockwise, O(T) memory; masks only through `causal`/`kv_lengths`,
      biases only linear ones like causal ALiBi; no weights), or 'auto'
      (chunked whenever the call allows it, else dense).
    chunk_size: query and key block size of the chunked path.
    rngs: `nnx.Rngs` for the parameters.
  """

  def __init__(self, d_model: int, num_heads: int, *, positional: Positional = None,
               max_length: Optional[int] = None, causal: bool = True,
               use_bias: bool = False, dtype=None, param_dtype=jnp.float32,
               implementation: str = 'dense', chunk_size: int = 512,
               rngs: nnx.Rngs):
    if num_heads < 1 or d_model % num_heads:
      raise ValueError(
          f'num_heads={num_heads} must be >= 1 and divide d_model={d_model}.')
    if implementation not in IMPLEMENTATIONS:
      raise ValueError(
          f'implementation={implementation!r}; choose one of {IMPLEMENTATIONS}.')
    self.implementation, self.chunk_size = implementation, chunk_size
    self.d_model, self.num_heads = d_model, num_heads
    self.head_dim = d_model // num_heads
    heads = (num_heads, self.head_dim)
    proj = dict(use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.W_Q = nnx.LinearGeneral(d_model, heads, **proj)
    self.W_K = nnx.LinearGeneral(d_model, heads, **proj)
    self.W_V = nnx.LinearGeneral(d_model, heads, **proj)
    self.W_O = nnx.LinearGeneral(heads, d_model, axis=(-2, -1), **proj)
    self.positional = _resolve_positional(
        positional, d_model=d_model, num_heads=num_heads,
        max_length=max_length, causal=causal, rngs=rngs)

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
    if self._use_chunked(mask, bias, return_weights, positions, context_positions):
      out = chunked_attention(q, k, v, causal=causal, kv_lengths=kv_lengths,
                              alibi_slopes=self.positional.linear_bias_slopes(),
                              q_chunk=self.chunk_size, k_chunk=self.chunk_size)
      return self.W_O(out), None
    if causal:
      if x.shape[1] != context.shape[1]:
        raise ValueError(f'causal=True needs T_q == T_k, got {x.shape[1]} and {context.shape[1]}.')
      mask = combine_masks(mask, causal_mask(x.shape[1]))
    if kv_lengths is not None:
      keys = jnp.arange(context.shape[1])[None, None, None, :]
      mask = combine_masks(mask, keys < jnp.asarray(kv_lengths)[:, None, None, None])
    bias = _add_biases(bias, self.positional.attention_bias(positions, context_positions))
    out, weights = multi_head_attention(q, k, v, mask=mask, bias=bias)
    return self.W_O(out), (weights if return_weights else None)

  def _use_chunked(self, mask, bias, return_weights, positions, context_positions) -> bool:
    """Whether this call takes the chunked path; a clear error when
    'chunked' was asked for a call it cannot serve."""
    if self.implementation == 'dense':
      return False
    enc = self.positional
    reasons = []
    if return_weights:
      reasons.append('return_weights=True (the chunked path never forms the weights)')
    if mask is not None or bias is not None:
      reasons.append('a dense mask or bias (pass causal= and kv_lengths= instead)')
    if enc.has_attention_bias and enc.linear_bias_slopes() is None:
      reasons.append(f'the bias of {type(enc).__name__}, which is not linear in i - j')
    if enc.linear_bias_slopes() is not None and not (
        isinstance(positions, np.ndarray) and isinstance(context_positions, np.ndarray)
        and np.array_equal(positions, np.arange(len(positions)))
        and np.array_equal(context_positions, np.arange(len(context_positions)))):
      reasons.append('a position bias with positions other than the default 0 … T-1')
    if self.implementation == 'chunked' and reasons:
      raise ValueError("implementation='chunked' cannot serve this call: "
                       + '; '.join(reasons) + ". Use 'dense' or 'auto'.")
    return not reasons


class SelfAttention(nnx.Module):
  """Single-head self-attention, lesson 7.2: `softmax(QKᵀ/√d_k) V`.

  Args:
    d_model: input width; inputs are `[B, T, d_model]`.
    d_k: width of queries and keys (and values unless `d_v` is given).
    d_v: width of values and of the output; default `d_k`.
    positional: encoding acting inside attention ('rope', 'alibi', …).
    max_length, causal: passed to the encoding when built from a name.
    rngs: `nnx.Rngs` for the parameters.
  """

  def __init__(self, d_model: int, d_k: int, *, d_v: Optional[int] = None,
               positional: Positional = None, max_length: Optional[int] = None,
               causal: bool = True, dtype=None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    proj = dict(use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.d_model = d_model
    self.W_Q = nnx.Linear(d_model, d_k, **proj)
    self.W_K = nnx.Linear(d_model, d_k, **proj)
    self.W_V = nnx.Linear(d_model, d_v or d_k, **proj)
    self.positional = _resolve_positional(
        positional, d_model=d_k, num_heads=1, max_length=max_length,
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
