"""Flax NNX attention modules: parameters around the pure functions.

`SelfAttention` is lesson 7.2 (one head, W_Q/W_K/W_V); `MultiHeadAttention`
is lesson 7.3 (W_Q, W_K, W_V, W_O over `num_heads` heads). Their projection
kernels have the layout of `flax.nnx.MultiHeadAttention` (query/key/value
`[d_model, H, D]`, out `[H, D, d_model]`), so weights move between the two.

A module is causal or not as one property, set at construction: it decides
both the mask and the encoding's bias (ALiBi's is -slope·(i - j) causal,
-slope·|i - j| otherwise). A positional encoding (a registry name or a
`PositionalEncoding`) acts here through its in-attention hooks: RoPE rotates
q and k, relative encodings contribute to the scores (from positions, or
from a `ScoreContext` with q, k and the encoding's `token_features` of the
layer input: CoPE, forgetting attention). Encodings added to the embeddings
(sinusoidal, learned) are refused: they belong to the model. How scores
become weights (softmax, or stick-breaking) is the module's `normalization`,
independent of the encoding.

Every call goes through `scaled_dot_product_attention`, which picks the
kernel. As in Flax, a call returns the output; `return_weights=True` also
returns the weights (which only the dense kernel forms).
"""

from typing import Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention import check_options
from attention_jax.attention import scaled_dot_product_attention
from attention_jax.attention.heads import as_rank4
from attention_jax.attention.normalization import Normalization
from attention_jax.attention.normalization import as_normalization
from attention_jax.attention.scalable import scalable_softmax_queries
from attention_jax.attention.scalable import visible_keys
from attention_jax.positional import ENCODINGS
from attention_jax.positional import NoPE
from attention_jax.positional import PositionalEncoding
from attention_jax.positional import make_encoding
from attention_jax.positional.base import ScoreContext
from attention_jax.positional.base import embedding_only

Positional = Union[str, PositionalEncoding, None]


def _refuse_embedding_encoding(cls: type, label: str, owner: str):
  if embedding_only(cls):
    raise ValueError(
        f'encoding {label} is added to the embeddings, not inside attention, so '
        f'{owner} cannot use it: give it to the model (e.g. TransformerLM('
        f'encoding={label})) or add it before attention with '
        '`encoding.add_to_embeddings(x, positions)`.')


def resolve_encoding(encoding: Positional, *, d_model, num_heads, max_positions, causal,
                     rngs, owner) -> PositionalEncoding:
  """The encoding an attention module `owner` uses: built from a name with the
  module's `causal`, or checked to agree with it; never one that only adds
  to the embeddings."""
  if encoding is None:
    return NoPE()
  if isinstance(encoding, str):
    cls = ENCODINGS.get(encoding)
    if cls is not None:  # refuse before building: 'learned' would ask for a length
      _refuse_embedding_encoding(cls, repr(encoding), owner)
    return make_encoding(encoding, d_model=d_model, num_heads=num_heads,
                         max_positions=max_positions, causal=causal, rngs=rngs)
  if not isinstance(encoding, PositionalEncoding):
    raise TypeError(
        'encoding must be a registry name, a PositionalEncoding or None, '
        f'got {type(encoding).__name__}.')
  _refuse_embedding_encoding(type(encoding), type(encoding).__name__, owner)
  built_causal = getattr(encoding, 'causal', None)
  if built_causal is not None and bool(built_causal) != causal:
    raise ValueError(
        f'{type(encoding).__name__} was built with causal={built_causal} but {owner} '
        f'has causal={causal}: build the encoding with causal={causal} '
        f'(make_encoding(..., causal={causal})) or the module with '
        f'causal={built_causal}.')
  return encoding


class MultiHeadAttention(nnx.Module):
  """Multi-head attention, lesson 7.3: `concat(head_1 … head_H) W_O`.

  Args:
    d_model: model width; inputs and outputs are `[B, T, d_model]`.
    num_heads: heads; must divide `d_model` (head_dim = d_model // num_heads).
    encoding: encoding acting inside attention (see module docstring).
    causal: query i attends only to keys j <= i; also selects the encoding's
      causal bias. Default True; False for bidirectional or cross-attention.
    num_kv_heads: key/value heads, dividing `num_heads`; default `num_heads`.
      Fewer is grouped-query attention, 1 is multi-query attention: smaller
      W_K/W_V and a cache `num_heads / num_kv_heads` times smaller.
    sliding_window: if set, a query attends only to the `sliding_window`
      nearest keys on each side (|i - j| < window, token indices); with
      `causal`, the `sliding_window` latest tokens.
    max_positions: passed to an encoding built from a name.
    use_bias: biases on the four projections (Flax's default is True).
    dtype, param_dtype: computation and parameter dtypes of the projections.
    implementation: 'auto' (the fastest kernel that can serve each call),
      'dense' (weights, any mask or bias), 'chunked' (blockwise, O(T)
      memory; masks only through `causal`/`kv_lengths`/`sliding_window`,
      biases only linear ones like causal ALiBi; no weights) or 'cudnn' (GPU,
      half precision); see `attention.dispatch.KERNELS`.
    chunk_size: query and key block size of the chunked kernel (default:
      `chunked_attention`'s, per strategy).
    chunked_strategy: 'scan' | 'unrolled' | 'auto' (`chunked_attention`).
    scalable_softmax: None (off), or the initial value of a learned per-head
      s_h: each query's logits are multiplied by s_h · log(n), n the number of
      keys it may see (scalable softmax, `attention.scalable`). Combines with
      any encoding and kernel.
    normalization: 'softmax' (default), 'stick_breaking' or a
      `StickBreaking(attend_current=...)` (Tan et al. 2025,
      `attention.stick_breaking`; causal modules only). Combines with any
      encoding; served by the dense and chunked kernels.
    rngs: `nnx.Rngs` for the parameters.
  """

  def __init__(self, d_model: int, num_heads: int, *, encoding: Positional = None,
               causal: bool = True, num_kv_heads: Optional[int] = None,
               sliding_window: Optional[int] = None,
               max_positions: Optional[int] = None,
               use_bias: bool = False, dtype=None, param_dtype=jnp.float32,
               implementation: str = 'auto', chunk_size: Optional[int] = None,
               chunked_strategy: str = 'auto',
               scalable_softmax: Optional[float] = None,
               normalization: Normalization = 'softmax',
               rngs: nnx.Rngs):
    if num_heads < 1 or d_model % num_heads:
      raise ValueError(
          f'num_heads={num_heads} must be >= 1 and divide d_model={d_model}.')
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if num_kv_heads < 1 or num_heads % num_kv_heads:
      raise ValueError(f'num_kv_heads={num_kv_heads} must be >= 1 and divide '
                       f'num_heads={num_heads}.')
    if sliding_window is not None and (not isinstance(sliding_window, int)
                                       or sliding_window < 1):
      raise ValueError(f'sliding_window={sliding_window!r}: use an integer >= 1 or None.')
    check_options(implementation, chunked_strategy, chunk_size)
    self.normalization = as_normalization(normalization)
    if self.normalization is not None and not causal:
      raise ValueError(f'normalization={normalization!r} (stick-breaking) reads the keys '
                       'before each query: it needs causal=True.')
    self.implementation, self.chunk_size = implementation, chunk_size
    self.chunked_strategy, self.causal = chunked_strategy, bool(causal)
    self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
    self.sliding_window = sliding_window
    self.head_dim = d_model // num_heads
    heads = (num_heads, self.head_dim)
    proj = dict(use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.W_Q = nnx.LinearGeneral(d_model, heads, **proj)
    self.W_K = nnx.LinearGeneral(d_model, (num_kv_heads, self.head_dim), **proj)
    self.W_V = nnx.LinearGeneral(d_model, (num_kv_heads, self.head_dim), **proj)
    self.W_O = nnx.LinearGeneral(heads, d_model, axis=(-2, -1), **proj)
    self.positional = resolve_encoding(
        encoding, d_model=d_model, num_heads=num_heads, max_positions=max_positions,
        causal=self.causal, rngs=rngs, owner='MultiHeadAttention')
    if scalable_softmax is not None and not scalable_softmax > 0:
      raise ValueError(f'scalable_softmax={scalable_softmax!r}: the initial s must be > 0 '
                       '(or None for plain softmax).')
    self.ssmax_scale = (None if scalable_softmax is None else
                        nnx.Param(jnp.full((num_heads,), scalable_softmax, jnp.float32)))

  def __call__(self, x: jnp.ndarray, context: Optional[jnp.ndarray] = None, *,
               mask: Optional[jnp.ndarray] = None,
               bias: Optional[jnp.ndarray] = None,
               positions: Optional[jnp.ndarray] = None,
               context_positions: Optional[jnp.ndarray] = None,
               kv_lengths: Optional[jnp.ndarray] = None,
               return_weights: bool = False):
    """Self-attention over `x`, or cross-attention from `x` to `context`.

    Args:
      x: queries' inputs `[B, T_q, d_model]`.
      context: keys'/values' inputs `[B, T_k, d_model]`; default `x`.
      mask: boolean `[T_q, T_k]` or `[B|1, H|1, T_q, T_k]`, True = attend,
        combined with the module's causal mask and window.
      bias: additive, `[T_q, T_k]` or `[B|1, H|1, T_q, T_k]`.
      positions: integer `[T_q]` or `[B, T_q]`; default `0 … T_q-1`.
      context_positions: for the keys; default `positions` for
        self-attention, `0 … T_k-1` for cross-attention.
      kv_lengths: int `[B]`: keys at positions >= kv_lengths[b] are padding.
      return_weights: also return the attention weights (dense kernel).

    Returns:
      out `[B, T_q, d_model]`, or `(out, weights float32 [B, H, T_q, T_k])`
      with `return_weights`.
    """
    self_attention = context is None
    context = x if self_attention else context
    for name, a in (('x', x), ('context', context)):
      if a.ndim != 3 or a.shape[-1] != self.d_model:
        raise ValueError(
            f'{name} must be [batch, length, {self.d_model}], got {a.shape}.')
    if self.causal and x.shape[1] != context.shape[1]:
      raise ValueError(f'this MultiHeadAttention is causal (causal=True), which needs as '
                       f'many queries as keys, got {x.shape[1]} and {context.shape[1]}; '
                       'build cross-attention with causal=False.')
    if positions is None:
      positions = np.arange(x.shape[1], dtype=np.int32)
    if context_positions is None:
      context_positions = (positions if self_attention
                           else np.arange(context.shape[1], dtype=np.int32))
    q, k, v = self.W_Q(x), self.W_K(context), self.W_V(context)
    q, k = self.positional.rotate_queries_keys(q, k, positions, context_positions)
    if self.ssmax_scale is not None:
      n = visible_keys(np.arange(x.shape[1]), context.shape[1], causal=self.causal,
                       window=self.sliding_window, kv_lengths=kv_lengths)
      q = scalable_softmax_queries(q, self.ssmax_scale[...], n)
    q_features = self.positional.token_features(x)
    score_bias = self.positional.score_contribution(ScoreContext(
        q=q, k=k, q_positions=positions, k_positions=context_positions,
        q_slots=np.arange(x.shape[1]) if self_attention else None, q_features=q_features,
        k_features=(q_features if self_attention
                    else self.positional.token_features(context)),
        causal=self.causal, window=self.sliding_window, kv_lengths=kv_lengths,
        mask=as_rank4('mask', mask)))
    result = scaled_dot_product_attention(
        q, k, v, mask=mask, bias=bias, score_bias=score_bias,
        causal=self.causal, kv_lengths=kv_lengths, window=self.sliding_window,
        normalization=self.normalization,
        implementation=self.implementation, return_weights=return_weights,
        chunk_size=self.chunk_size, chunked_strategy=self.chunked_strategy)
    if return_weights:
      out, weights = result
      return self.W_O(out), weights
    return self.W_O(result)

  def init_cache(self, batch_size: int, cache_size: int, dtype=jnp.float32) -> dict:
    """An empty cache for `extend`: key/value `[B, H_kv, cache_size, D]`
    (rotated keys when the encoding rotates), their int32 positions `[B,
    cache_size]` and, for an encoding with `token_features`, the keys'
    features float32 `[B, cache_size, F]`.

    Heads before slots: the layout the score and output contractions read,
    so a decoding step does not transpose the whole cache (it did, costing
    more than the step's arithmetic, in the [B, T, H, D] order)."""
    shape = (batch_size, self.num_kv_heads, cache_size, self.head_dim)
    cache = dict(key=jnp.zeros(shape, dtype), value=jnp.zeros(shape, dtype),
                 positions=jnp.zeros((batch_size, cache_size), jnp.int32))
    features = jax.eval_shape(self.positional.token_features, jax.ShapeDtypeStruct(
        (batch_size, cache_size, self.d_model), jnp.float32))
    if features is not None:
      cache['features'] = jnp.zeros(features.shape, jnp.float32)
    return cache

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
    check_cache_slots(start, x.shape[1], cache['key'].shape[2])
    return self._extend(x, cache, start, positions=positions)

  def _extend(self, x, cache, start, *, positions=None):
    """`extend` without the slot check, for callers that guarantee the range."""
    if not self.causal:
      raise ValueError('extend (cached decoding) is causal attention, but this module '
                       'has causal=False.')
    (b, s_len, _), t_max = x.shape, cache['key'].shape[2]
    slots = start + jnp.arange(s_len, dtype=jnp.int32)
    if positions is None:
      positions = slots
    positions = jnp.broadcast_to(jnp.asarray(positions, jnp.int32), (b, s_len))
    q, k, v = self.W_Q(x), self.W_K(x), self.W_V(x)
    q, k = self.positional.rotate_queries_keys(q, k, positions, positions)
    if self.ssmax_scale is not None:  # slot i sees slots 0 … i (and the window)
      n = visible_keys(slots, t_max, causal=True, window=self.sliding_window)
      q = scalable_softmax_queries(q, self.ssmax_scale[...], n)
    write = lambda buf, new, axis: jax.lax.dynamic_update_slice_in_dim(
        buf, new.astype(buf.dtype), start, axis=axis)
    heads_first = lambda a: jnp.swapaxes(a, 1, 2)  # [B, S, H, D] <-> [B, H, S, D]
    features = self.positional.token_features(x)
    cache = dict(cache, key=write(cache['key'], heads_first(k), 2),
                 value=write(cache['value'], heads_first(v), 2),
                 positions=write(cache['positions'], positions, 1))
    if features is not None:
      cache['features'] = write(cache['features'], features, 1)
    keys = jnp.arange(t_max)[None, :]
    mask = keys <= slots[:, None]  # causal; also hides the slots not yet written
    if self.sliding_window is not None:
      mask = mask & (slots[:, None] - keys < self.sliding_window)
    all_keys = heads_first(cache['key']).astype(q.dtype)
    score_bias = self.positional.score_contribution(ScoreContext(
        q=q, k=all_keys, q_positions=positions, k_positions=cache['positions'],
        q_slots=slots, q_features=features, k_features=cache.get('features'), causal=True,
        window=self.sliding_window))
    # The mask moves with `start`, which blocks do not express; the queries
    # are one token (or a prompt), cheap on the other kernels.
    implementation = 'auto' if self.implementation == 'chunked' else self.implementation
    out = scaled_dot_product_attention(
        q, all_keys, heads_first(cache['value']).astype(v.dtype), mask=mask,
        score_bias=score_bias, normalization=self.normalization, q_slots=slots,
        implementation=implementation)
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
    causal: query i attends only to keys j <= i (and the encoding's causal
      bias); default True.
    max_positions: passed to an encoding built from a name.
    implementation: as in `MultiHeadAttention`; default 'auto'.
    rngs: `nnx.Rngs` for the parameters.
  """

  def __init__(self, d_model: int, d_k: int, *, d_v: Optional[int] = None,
               encoding: Positional = None, causal: bool = True,
               max_positions: Optional[int] = None, dtype=None,
               param_dtype=jnp.float32, implementation: str = 'auto',
               rngs: nnx.Rngs):
    check_options(implementation)
    proj = dict(use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.d_model, self.causal, self.implementation = d_model, bool(causal), implementation
    self.W_Q = nnx.Linear(d_model, d_k, **proj)
    self.W_K = nnx.Linear(d_model, d_k, **proj)
    self.W_V = nnx.Linear(d_model, d_v or d_k, **proj)
    self.positional = resolve_encoding(
        encoding, d_model=d_k, num_heads=1, max_positions=max_positions,
        causal=self.causal, rngs=rngs, owner='SelfAttention')

  def __call__(self, x: jnp.ndarray, *, mask: Optional[jnp.ndarray] = None,
               bias: Optional[jnp.ndarray] = None,
               positions: Optional[jnp.ndarray] = None, return_weights: bool = False):
    """x `[B, T, d_model]`; mask (True = attend) and bias `[T, T]`,
    `[B|1, T, T]` or `[B|1, 1, T, T]` (one head: rank 3 is unambiguous here);
    positions `[T]` or `[B, T]` -> out `[B, T, d_v]`, or `(out, weights
    float32 [B, T, T])` with `return_weights`."""
    if x.ndim != 3 or x.shape[-1] != self.d_model:
      raise ValueError(f'x must be [batch, length, {self.d_model}], got {x.shape}.')
    if positions is None:
      positions = np.arange(x.shape[1], dtype=np.int32)
    # One head: a head axis of size 1 lets the multi-head path do the work.
    q, k, v = (w(x)[:, :, None, :] for w in (self.W_Q, self.W_K, self.W_V))
    q, k = self.positional.rotate_queries_keys(q, k, positions, positions)
    head_axis = lambda a: a[:, None] if a is not None and a.ndim == 3 else a
    features = self.positional.token_features(x)
    score_bias = self.positional.score_contribution(ScoreContext(
        q=q, k=k, q_positions=positions, k_positions=positions,
        q_slots=np.arange(x.shape[1]), q_features=features, k_features=features,
        causal=self.causal, mask=as_rank4('mask', head_axis(mask))))
    result = scaled_dot_product_attention(
        q, k, v, mask=head_axis(mask), bias=head_axis(bias),
        score_bias=score_bias, causal=self.causal,
        implementation=self.implementation, return_weights=return_weights)
    if return_weights:
      return result[0][:, :, 0, :], result[1][:, 0]
    return result[:, :, 0, :]
