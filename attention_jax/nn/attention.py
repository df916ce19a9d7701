"""Flax NNX attention modules: parameters around the pure functions.

`SelfAttention` is lesson 7.2 (one head, W_Q/W_K/W_V, in `self_attention.py`);
`MultiHeadAttention` is lesson 7.3 (W_Q, W_K, W_V, W_O over `num_heads`
heads). Their projection kernels have the layout of
`flax.nnx.MultiHeadAttention` (query/key/value `[d_model, H, D]`, out `[H, D,
d_model]`), so weights move between the two; the class docstring lists where
the two modules' interfaces differ.

A module is causal or not as one property, set at construction by the
required `causal=` (no default: either one would be silently wrong for the other use):
it decides both the mask and the encoding's bias (ALiBi's is -slope·(i - j)
causal, -slope·|i - j| otherwise). A positional encoding (a registry name
or a `PositionalEncoding`) acts here through its in-attention hooks: RoPE
rotates q and k, relative encodings contribute to the scores (from
positions, or from a `ScoreContext` with q, k and the encoding's
`token_features` of the layer input: CoPE, forgetting attention). Encodings added to the embeddings
(sinusoidal, learned) are refused: they belong to the model. How scores
become weights (softmax, or stick-breaking) is the module's `normalization`,
independent of the encoding.

Every call goes through `scaled_dot_product_attention`, which picks the
kernel. As in Flax, a call returns the output; `return_weights=True` also
returns the weights (which only the dense kernel forms), `sow_weights=True`
sows them as Flax does. `encoded_queries_keys(x)` returns q and k as the
scores see them (projected, rotated, scaled), without attending.

Where the parameters live (paths in `nnx.state(module)`): the projections
at `W_Q`, `W_K`, `W_V`, `W_O` (`kernel`, and `bias` with `use_bias`); the
encoding's at `positional.<name>` (e.g. `positional.pos_emb` of CoPE,
`positional.raw_r1` of KERPLE); scalable softmax's s at `ssmax_scale`;
stick-breaking's 'head_bias' remainder at `remainder.head_bias` and
`remainder.norm.{scale,bias}`; learned sink logits (`sinks=True`) at
`sink_logits` (`[num_heads]`). The attribute is `positional` for stored
checkpoints' sake; read the encoding itself through the public
`module.encoding` (the same object), not the name, which is also the
subpackage `aj.positional`.
"""

from typing import Optional

import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention import scaled_dot_product_attention
from attention_jax.attention.heads import as_rank4
from attention_jax.attention.normalization import Normalization
from attention_jax.attention.scalable import scalable_softmax_queries
from attention_jax.attention.scalable import visible_keys
from attention_jax.nn.arguments import call_inputs
from attention_jax.nn.arguments import check_call
from attention_jax.nn.arguments import check_full_pass
from attention_jax.nn.arguments import checked_arguments
from attention_jax.nn.arguments import default_positions
from attention_jax.nn.cache import CACHE_NAMES
from attention_jax.nn.cache import KVCache
from attention_jax.nn.dropout import dropped_values
from attention_jax.nn.sharding import BATCH_LENGTH_EMBED
from attention_jax.nn.sharding import KV_HEADS
from attention_jax.nn.sharding import QUERY_HEADS
from attention_jax.nn.sharding import constrain
from attention_jax.nn.stick_breaking import HeadBiasRemainder
from attention_jax.nn.self_attention import Positional
from attention_jax.nn.self_attention import SelfAttention  # pylint: disable=unused-import
from attention_jax.nn.self_attention import resolve_encoding
from attention_jax.positional.base import ScoreContext
from attention_jax.positional.parameters import EMBED
from attention_jax.positional.parameters import HEADS
from attention_jax.positional.parameters import KV
from attention_jax.positional.parameters import KV_HEADS as KV_HEAD_AXIS
from attention_jax.positional.parameters import annotation
from attention_jax.positional.parameters import param


class MultiHeadAttention(KVCache, nnx.Module):
  """Multi-head attention, lesson 7.3: `concat(head_1 … head_H) W_O`.

  Written the lesson's way, `MultiHeadAttention(d_model, num_heads)`, or
  Flax's, `MultiHeadAttention(num_heads=8, in_features=512)`: positional
  arguments are always (d_model, num_heads), and Flax's order given
  positionally fails on `d_model % num_heads` with a message saying so.

  `causal` is required: `causal=True` for a decoder (query i sees keys j <=
  i), `causal=False` for an encoder or cross-attention (what
  `flax.nnx.MultiHeadAttention` computes without a mask or `is_causal`).

  Differences from `flax.nnx.MultiHeadAttention`: positional order (above);
  `use_bias` defaults to False (Flax: True); `qkv_features` must equal the
  width (head_dim = d_model // num_heads is what the encodings read); the
  call takes Flax's `inputs_q`/`inputs_k` (our `x`/`context`), but
  `inputs_v` only as the keys' input itself (values come from `context`);
  `causal` is set once at construction: a call's `is_causal` must agree;
  caches put heads before slots (`cached_key` is `[B, H_kv, T_max, D]`,
  Flax's `[B, T_max, H_kv, D]`), hold the positions too, and a decode call
  may append several tokens at once; the cache paths (`extend`,
  `decode=True`) never drop; `dropout_rate > 0` forms the weights (dense
  kernel) while dropping; `kernel_init`, `precision`, `attention_fn`,
  `normalize_qk`, `keep_rngs` and Flax's per-call `out_sharding` are not
  provided (parameters carry logical axis names instead: `nn.sharding`).
  Params and computation follow Flax's `dtype` / `param_dtype` (below). The
  kernels' names are the lesson's (`W_Q`, `W_K`, `W_V`, `W_O`; Flax:
  `query`, `key`, `value`, `out`), with the same layouts: `nn.from_flax` /
  `nn.to_flax` convert the parameters either way.

  Args:
    d_model: model width; inputs `[B, T, d_model]`; alias `in_features`.
    num_heads: heads; must divide `d_model` (head_dim = d_model // num_heads).
    in_features: Flax's name for `d_model` (keyword only; give one of them).
    qkv_features: None or `d_model` (see above).
    out_features: width of the output; default `d_model`.
    in_kv_features: width of `context` (cross-attention); default `d_model`.
    encoding: encoding acting inside attention (see module docstring).
    encoding_options: keyword options of the encoding's `build` when
      `encoding` is a name (e.g. `{'base': 500.0}` for 'rope').
    causal: required. True: query i attends only to keys j <= i (decoder),
      and the encoding's causal bias; False: every query sees every key
      (encoder, cross-attention; Flax's module without a mask). Omitting it
      is a ValueError.
    num_kv_heads: key/value heads, dividing `num_heads`; default `num_heads`.
      Fewer is grouped-query attention, 1 is multi-query attention: smaller
      W_K/W_V and a cache `num_heads / num_kv_heads` times smaller.
    sliding_window: if set, a query attends only to the `sliding_window`
      nearest keys on each side (|i - j| < window, token indices); with
      `causal`, the `sliding_window` latest tokens.
    max_positions: passed to an encoding built from a name.
    use_bias: biases on the four projections (Flax's default is True).
    dtype: the computation dtype, as Flax's: the projections (and the
      attention kernels, which read q, k and v) compute in it; None (the
      default, Flax's): inferred from the input and the parameters
      (`jnp.result_type`, so float32 parameters give float32). Scores,
      softmax and stick-breaking's cumulative sums, RoPE's angles and the
      encoding's score contributions stay float32 whatever it is; the output
      is in it. Keyword only; a dtype that is not floating is a ValueError,
      something that is not a dtype a TypeError.
    param_dtype: the dtype every parameter (projections, the encoding's,
      scalable softmax's s, stick-breaking's remainder) is stored in;
      default float32.
    dropout_rate: dropout on the attention weights (Flax's), default 0.0: no
      dropout, no RNG needed, results unchanged. While dropping, the call
      forms the weights, so `implementation` must be 'auto' or 'dense'; with
      `deterministic` the fused kernels serve it as usual.
    deterministic: True = no dropout. None: must come from the call or
      `model.train()` / `model.eval()` when `dropout_rate > 0`.
    broadcast_dropout: one dropout mask shared over batch and heads (Flax's
      default, True), or independent ones (False).
    decode: Flax's stateful decoding: a call appends its tokens to the cache
      set up by `init_cache(input_shape)` (see there); the call's `decode`
      takes precedence.
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
      `StickBreaking(attend_current=..., remainder=...)` (Tan et al. 2025,
      `attention.stick_breaking`; causal modules only). Combines with any
      encoding; served by the dense and chunked kernels. With
      `remainder='head_bias'` (the authors' model code) the module holds the
      learned vector and GroupNorm (`nn.stick_breaking`) as `remainder`.
    logit_soft_cap: None, or c > 0: every score, biases added, becomes
      `c · tanh(s / c)` before the mask (Gemma 2 uses 50.0; see
      `attention.soft_cap`). Softmax only.
    sinks: True: one learned sink logit per head (gpt-oss), in param_dtype at
      `sink_logits`, starting at zero, which joins each softmax's
      denominator only, so a head may attend to nothing
      (`attention.sink_logits`). Not `WindowBias(sink=)`, which keeps the
      first tokens visible. Softmax only.
    rngs: `nnx.Rngs` for the parameters (and, with `dropout_rate > 0`, a
      fork of its 'dropout' stream).
  """

  def __init__(self, d_model: Optional[int] = None, num_heads: Optional[int] = None, *,
               in_features: Optional[int] = None, qkv_features: Optional[int] = None,
               out_features: Optional[int] = None, in_kv_features: Optional[int] = None,
               encoding: Positional = None, encoding_options: Optional[dict] = None,
               causal: Optional[bool] = None, num_kv_heads: Optional[int] = None,
               sliding_window: Optional[int] = None,
               max_positions: Optional[int] = None,
               use_bias: bool = False, dtype=None, param_dtype=jnp.float32,
               dropout_rate: float = 0.0, deterministic: Optional[bool] = None,
               broadcast_dropout: bool = True, decode: bool = False,
               implementation: str = 'auto', chunk_size: Optional[int] = None,
               chunked_strategy: str = 'auto',
               scalable_softmax: Optional[float] = None,
               normalization: Normalization = 'softmax',
               logit_soft_cap: Optional[float] = None, sinks: bool = False,
               rngs: nnx.Rngs):
    a = checked_arguments(
        d_model=d_model, num_heads=num_heads, in_features=in_features,
        qkv_features=qkv_features, out_features=out_features, in_kv_features=in_kv_features,
        encoding=encoding, causal=causal, num_kv_heads=num_kv_heads, sliding_window=sliding_window,
        max_positions=max_positions, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
        dropout_rate=dropout_rate, deterministic=deterministic,
        broadcast_dropout=broadcast_dropout, decode=decode, implementation=implementation,
        chunk_size=chunk_size, chunked_strategy=chunked_strategy,
        scalable_softmax=scalable_softmax, normalization=normalization,
        logit_soft_cap=logit_soft_cap, sinks=sinks, rngs=rngs)
    d_model, num_heads, num_kv_heads = a.d_model, a.num_heads, a.num_kv_heads
    dtype, param_dtype, causal = a.dtype, a.param_dtype, a.causal
    self.normalization = a.normalization
    self.logit_soft_cap = None if logit_soft_cap is None else float(logit_soft_cap)
    self.implementation, self.chunk_size = implementation, chunk_size
    self.chunked_strategy, self.causal = chunked_strategy, bool(causal)
    self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
    self.in_features, self.qkv_features = d_model, d_model  # Flax's names
    self.out_features = d_model if out_features is None else out_features
    self.in_kv_features = d_model if in_kv_features is None else in_kv_features
    self.sliding_window = sliding_window
    self.head_dim = d_model // num_heads
    self.dtype, self.param_dtype = dtype, param_dtype
    heads = (num_heads, self.head_dim)
    proj = dict(use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    # Logical axis names of each kernel and its bias (`nn.sharding`).
    axes = lambda kernel, bias: dict(kernel_metadata=annotation(kernel),
                                     bias_metadata=annotation(bias))
    self.W_Q = nnx.LinearGeneral(d_model, heads, **proj,
                                 **axes((EMBED, HEADS, KV), (HEADS, KV)))
    self.W_K = nnx.LinearGeneral(self.in_kv_features, (num_kv_heads, self.head_dim), **proj,
                                 **axes((EMBED, KV_HEAD_AXIS, KV), (KV_HEAD_AXIS, KV)))
    self.W_V = nnx.LinearGeneral(self.in_kv_features, (num_kv_heads, self.head_dim), **proj,
                                 **axes((EMBED, KV_HEAD_AXIS, KV), (KV_HEAD_AXIS, KV)))
    self.W_O = nnx.LinearGeneral(heads, self.out_features, axis=(-2, -1), **proj,
                                 **axes((HEADS, KV, EMBED), (EMBED,)))
    self.positional = resolve_encoding(
        encoding, d_model=d_model, num_heads=num_heads, max_positions=max_positions,
        causal=self.causal, rngs=rngs, owner='MultiHeadAttention', options=encoding_options,
        dtype=dtype, param_dtype=param_dtype)
    self.ssmax_scale = (None if scalable_softmax is None else
                        param(jnp.full((num_heads,), scalable_softmax), (HEADS,), param_dtype))
    self.dropout_rate, self.deterministic = float(dropout_rate), deterministic
    self.broadcast_dropout, self.decode = broadcast_dropout, decode
    # Forked only when dropping, so that rate 0 leaves `rngs` (and therefore
    # every later parameter) exactly as before.
    self.rngs = rngs.dropout.fork() if dropout_rate > 0 else nnx.data(None)
    # Built last and only for 'head_bias': the other parameters (and their
    # RNG draws) stay what they were without it.
    self.remainder = (HeadBiasRemainder(num_heads, self.head_dim, dtype=dtype,
                                        param_dtype=param_dtype, rngs=rngs)
                      if self.normalization is not None
                      and self.normalization.remainder == 'head_bias' else None)
    # Zeros, drawing no RNG: the other parameters stay what they were without it.
    # Stored in param_dtype and named by head like every parameter; read in
    # float32 where they join the softmax.
    self.sink_logits = (param(jnp.zeros((num_heads,)), (HEADS,), param_dtype) if sinks
                        else None)
    for name in CACHE_NAMES:  # Flax's stateful cache (init_cache with a shape)
      setattr(self, f'cached_{name}', nnx.data(None))
    self.cache_index = nnx.data(None)

  @property
  def encoding(self):
    """The `PositionalEncoding` acting in this attention (`NoPE` for none):
    the object whose parameters sit at `positional.<name>` (module docstring)."""
    return self.positional

  def encoded_queries_keys(self, x: jnp.ndarray, context: Optional[jnp.ndarray] = None, *,
                           positions: Optional[jnp.ndarray] = None,
                           context_positions: Optional[jnp.ndarray] = None,
                           kv_lengths: Optional[jnp.ndarray] = None):
    """q and k as the scores see them, without attending: projected, encoded
    (`rotate_queries_keys`: RoPE, xPos, …) and, with scalable softmax, q
    scaled by s·log n. The kernels' scores are `q·k/√D` of these, plus the
    encoding's score contribution (ALiBi, CoPE, …) and the mask.

    Args: as the call's `x`, `context`, `positions`, `context_positions` and
    `kv_lengths` (which sets n for scalable softmax).

    Returns:
      (q `[B, T_q, num_heads, head_dim]`, k `[B, T_k, num_kv_heads,
      head_dim]`) in the projections' dtype.
    """
    context = x if context is None else context
    q, k, _ = self._encoded_qkv(x, context, *default_positions(
        x, context, positions, context_positions), kv_lengths)
    return q, k

  def _encoded_qkv(self, x, context, positions, context_positions, kv_lengths):
    """(q, k, v) of the call: `encoded_queries_keys`' q and k, and v."""
    q, k, v = (constrain(self.W_Q(x), QUERY_HEADS), constrain(self.W_K(context), KV_HEADS),
               constrain(self.W_V(context), KV_HEADS))
    q, k = self.positional.rotate_queries_keys(q, k, positions, context_positions)
    if self.ssmax_scale is not None:
      n = visible_keys(np.arange(x.shape[1]), context.shape[1], causal=self.causal,
                       window=self.sliding_window, kv_lengths=kv_lengths)
      q = scalable_softmax_queries(q, self.ssmax_scale[...], n)
    return q, k, v

  def __call__(self, x: Optional[jnp.ndarray] = None,
               context: Optional[jnp.ndarray] = None,
               inputs_v: Optional[jnp.ndarray] = None, *,
               inputs_q: Optional[jnp.ndarray] = None,
               inputs_k: Optional[jnp.ndarray] = None,
               is_causal: Optional[bool] = None,
               mask: Optional[jnp.ndarray] = None,
               bias: Optional[jnp.ndarray] = None,
               positions: Optional[jnp.ndarray] = None,
               context_positions: Optional[jnp.ndarray] = None,
               kv_lengths: Optional[jnp.ndarray] = None,
               distances: Optional[jnp.ndarray] = None,
               return_weights: bool = False, sow_weights: bool = False,
               deterministic: Optional[bool] = None, rngs=None,
               decode: Optional[bool] = None,
               segment_ids: Optional[jnp.ndarray] = None,
               context_segment_ids: Optional[jnp.ndarray] = None):
    """Self-attention over `x`, or cross-attention from `x` to `context`.

    Flax's call, `module(inputs_q, inputs_k, inputs_v, is_causal=...)`, works
    too: `module(x, x, x)` is `module(x)`.

    Args:
      x: queries' inputs `[B, T_q, d_model]`; alias `inputs_q`.
      context: keys'/values' inputs `[B, T_k, in_kv_features]`; default `x`
        (`x` itself is self-attention); alias `inputs_k`.
      inputs_v: Flax's value input: only the keys' input itself (values are
        projected from the keys' input); anything else is a ValueError.
      inputs_q, inputs_k: Flax's names for `x` and `context` (give one name).
      is_causal: Flax's per-call flag: None, or the module's `causal`.
      mask: boolean `[T_q, T_k]` or `[B|1, H|1, T_q, T_k]`, True = attend,
        combined with the module's causal mask and window.
      bias: additive, `[T_q, T_k]` or `[B|1, H|1, T_q, T_k]`.
      positions: integer `[T_q]` or `[B, T_q]`; default `0 … T_q-1` (with
        `decode`: the cache slots).
      context_positions: for the keys; default `positions` for
        self-attention, `0 … T_k-1` for cross-attention.
      kv_lengths: int `[B]`: keys at positions >= kv_lengths[b] are padding.
      distances: int `[T_q, T_k]` or `[B, T_q, T_k]`, signed query-minus-key
        distances replacing the positions' (`ScoreContext.distances`).
      return_weights: also return the attention weights (dense kernel).
      sow_weights: sow the weights (before dropout) as Flax does:
        `nnx.Intermediate` 'attention_weights' (dense kernel).
      deterministic: overrides the module's (Flax's precedence).
      rngs: `nnx.Rngs`, an `RngStream` or a key for dropout; default the
        module's fork.
      decode: overrides the module's `decode`: append `x` to the cache held
        by the module (`init_cache(input_shape)`) and attend over it.
      segment_ids: int `[B, T_q]`, the documents of packed rows: a query
        attends only to keys of its own id (`attention.segments`: the
        conventions, padding); give `positions` that restart per document
        (`segment_positions`) for an encoding to see each document alone.
        A full pass, or cached decoding through `extend(...,
        segment_ids=)` (not `decode=True`); not with scalable softmax (its
        n would count other documents' keys).
      context_segment_ids: int `[B, T_k]`, the keys' ids; default
        `segment_ids` for self-attention (needed for cross-attention).

    Returns:
      out `[B, T_q, out_features]`, or `(out, weights float32 [B, H, T_q,
      T_k])` with `return_weights`.
    """
    x, context = call_inputs(x, context, inputs_q, inputs_k, inputs_v, is_causal, self.causal)
    decoding = self.decode if decode is None else decode
    mask = check_call(self, decoding, mask, distances, segment_ids, context_segment_ids)
    if decoding:
      return self._decode(x, context, positions, mask, bias, kv_lengths,
                          return_weights or sow_weights)
    self_attention = context is None
    context = x if self_attention else context
    q_ids, kv_ids, dropping = check_full_pass(self, x, context, mask, kv_lengths, segment_ids,
                                              context_segment_ids, deterministic)
    positions, context_positions = default_positions(x, context, positions, context_positions)
    q, k, v = self._encoded_qkv(x, context, positions, context_positions, kv_lengths)
    q_features = self.positional.token_features(x)
    score_bias = self.positional.score_contribution(ScoreContext(
        q=q, k=k, q_positions=positions, k_positions=context_positions,
        q_slots=np.arange(x.shape[1]) if self_attention else None, q_features=q_features,
        k_features=(q_features if self_attention
                    else self.positional.token_features(context)),
        causal=self.causal, window=self.sliding_window, kv_lengths=kv_lengths,
        mask=as_rank4('mask', mask),
        q_history=q if self_attention and self.positional.reads_query_history else None,
        distances=distances, q_segment_ids=q_ids, k_segment_ids=kv_ids))
    weighted = return_weights or sow_weights or dropping
    if self.remainder is not None:
      v = self.remainder.values(v)
    result = scaled_dot_product_attention(
        q, k, v, mask=mask, bias=bias, score_bias=score_bias,
        causal=self.causal, kv_lengths=kv_lengths, window=self.sliding_window,
        normalization=self.normalization,
        implementation=self.implementation, return_weights=weighted,
        chunk_size=self.chunk_size, chunked_strategy=self.chunked_strategy,
        segment_ids=q_ids, kv_segment_ids=kv_ids, **self._logit_options())
    if not weighted:
      return constrain(self.W_O(self._with_remainder(result)), BATCH_LENGTH_EMBED)
    out, weights = result
    if sow_weights:
      self.sow(nnx.Intermediate, 'attention_weights', weights)
    if dropping:
      out = dropped_values(weights, k, v, self.dropout_rate, self.broadcast_dropout,
                           self.rngs if rngs is None else rngs)
    out = constrain(self.W_O(self._with_remainder(out)), BATCH_LENGTH_EMBED)
    return (out, weights) if return_weights else out

  def _logit_options(self) -> dict:
    """The soft cap and the sink logits, as `scaled_dot_product_attention` takes them."""
    return dict(logit_soft_cap=self.logit_soft_cap,
                sinks=None if self.sink_logits is None else
                self.sink_logits[...].astype(jnp.float32))

  def _with_remainder(self, out):
    """Attention output `[B, T_q, H, D]` (D + 1 with 'head_bias') -> `[B, T_q,
    H, D]`: stick-breaking's learned remainder added and normalised, if on."""
    return out if self.remainder is None else self.remainder(out)
