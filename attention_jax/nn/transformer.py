"""A decoder-only transformer LM built from the library's modules.

Pre-LayerNorm blocks (x + MHA(LN(x)), then x + MLP(LN(x))), a final
LayerNorm and an *untied* output projection: tying would make the input
embedding double as the classifier, coupling the two in a way that differs
between encodings that add to the embeddings and those that do not.

The positional encoding is chosen by name: an absolute one (sinusoidal,
learned) is built once and added to the embeddings; one acting inside
attention is shared by every layer (its hooks and parameters the same in
all), or built once per layer when the encoding class says `per_layer`
(forgetting attention's gate, CoPE's and FIRE's tables: the official models
give every layer its own) or the caller asks for it (`encoding_per_layer`).
By default every layer's attention uses it; `encoding_layers` names the
layers that do (the official Multi-Token Attention models convolve in a few:
facebookresearch/RAM projects/mta, `mta_layers` "2,6,10,14,18" of 20 layers
at 300M, "2,6,10,14,18,22" of 24 above), the others attending without one,
or is a per-layer pattern of encodings and windows (`nn.layer_pattern`:
'rope/512,rope/512,rope/512,none' is RNoPE-SWA, RoPE in sliding windows
and a global NoPE layer every fourth). The blocks are in `nn.layers`.

Where the parameters live (paths in `nnx.state(model)`): `embed`, `blocks.<i>`
(`attention` with its `W_Q` … `W_O`, `attention_norm`, `mlp_norm`, `mlp_in`,
`mlp_out`), `final_norm`, `unembed`; the encoding's at `positional.<name>`
when it adds to the embeddings (learned: `positional.table`), else at
`blocks.<i>.attention.positional.<name>`, once, under the first layer
holding it when the layers share one. `model.encoding` (the model's
encoding) and `model.blocks[i].attention.encoding` (a layer's) are the
public handles; the attribute name `positional` stays for checkpoints.

Dropout (`dropout_rate`, default 0: none, and no RNG needed) acts on the
attention weights and on both residual branches, Flax's way: `deterministic`
at construction, per call, or for the whole model with `model.train()` /
`model.eval()`.

Precision, Flax's way: `param_dtype` stores every parameter (float32 by
default), `dtype` is the computation dtype of every layer (None, the
default: inferred from the inputs and parameters, as in Flax, so float32
parameters compute in float32). LayerNorm statistics, softmax and the other
float32 parts of attention (`MultiHeadAttention`) stay float32; the logits
are float32 whatever `dtype`. Every parameter names its axes for sharding
(`nn.sharding`).

Abacus embeddings (`abacus=`, McLeish et al. 2024) add a learned row per
digit's index in its number to the token embeddings, beside any encoding;
their parameters at `abacus.table`.

`nn.decoding.generate` and `greedy_predictions` decode any model with the
cache protocol: `init_cache(batch_size, cache_size) -> cache` and
`extend(tokens [B, S], cache, start, *, positions=None) -> (logits [B, S, V],
cache)`.
"""

from typing import Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.nn.arguments import check_constructor
from attention_jax.attention.normalization import Normalization
from attention_jax.attention.segments import check_segment_ids
from attention_jax.attention.segments import padding_ids
from attention_jax.attention.segments import segment_positions
from attention_jax.nn.cache import cached_documents
from attention_jax.nn.cache import guard_slots
from attention_jax.nn.cache import is_static
from attention_jax.nn.cache import poison
from attention_jax.nn.layer_pattern import encoded_layers
from attention_jax.nn.layer_pattern import layer_specs
from attention_jax.nn.layers import Block
from attention_jax.nn.layers import layer_norm
from attention_jax.nn.layers import linear
from attention_jax.nn.sharding import BATCH_LENGTH_EMBED
from attention_jax.nn.sharding import BATCH_LENGTH_VOCAB
from attention_jax.nn.sharding import constrain
from attention_jax.positional import PositionalEncoding
from attention_jax.positional import make_encoding
from attention_jax.positional.abacus import Abacus
from attention_jax.positional.learned import positions_proven
from attention_jax.positional.parameters import EMBED
from attention_jax.positional.parameters import VOCAB
from attention_jax.positional.parameters import annotation
from attention_jax.positional.parameters import check_dtypes


class TransformerLM(nnx.Module):
  """Causal LM: tokens `[B, T]` -> logits `[B, T, vocab_size]`.

  Args:
    vocab_size: number of token ids.
    d_model, num_heads, num_layers, mlp_dim: the usual sizes.
    encoding: a registry name ('none', 'sinusoidal', 'learned', 'rope', 'alibi', …);
      a modifier (':randomized', ':coupled') is not part of the name: it says
      which `positions` to pass (e.g. `positional.coupled_position_ids`).
    max_positions: positions the model must handle; sizes a learned table (its
      rows past the training lengths are never trained — which is what a
      length-extrapolation study measures).
    num_kv_heads, sliding_window, implementation, scalable_softmax,
      normalization: see `MultiHeadAttention` (GQA/MQA, local attention,
      dense/chunked/cudnn/auto: with 'auto', long evaluations run blockwise
      in O(T) memory; s·log(n) logit scaling; softmax or stick-breaking).
    encoding_options: keyword options of the encoding's `build`.
    encoding_per_layer: one encoding (and its parameters) per layer instead
      of one shared; None: the encoding class's `per_layer`.
    encoding_layers: None (default: every layer) or the 0-based indices of
      the layers whose attention uses an encoding acting inside attention,
      e.g. `(2, 6, 10, 14, 18)` for 'mta' as the official 300M model; the
      other layers get none (NoPE). An encoding added to the embeddings acts
      once, before the first layer, and takes no layers. Or a pattern
      string of per-layer `NAME` / `NAME/WINDOW` specs, repeated over the
      layers (`nn.layer_pattern`), e.g. 'rope/64,rope/64,rope/64,none';
      `encoding` is then its first encoded layer's and `encoding_options`
      go to that encoding (other names in the pattern take their defaults).
      `model.layer_specs` holds each layer's (encoding, window).
    dropout_rate: dropout on the attention weights and on the output of
      each residual branch (attention, MLP); default 0.0 (none).
    deterministic: True = no dropout; None: from the call or
      `model.train()` / `model.eval()` (needed when `dropout_rate > 0`).
    abacus: None, or the keyword options of `positional.Abacus`
      (`digit_tokens`, `rows`, `max_k`, `check_ids`): Abacus embeddings
      added to the token embeddings; the offset k is `__call__`'s
      `abacus_offset` (training), 0 when decoding.
    logit_soft_cap, sinks: every layer's (see `MultiHeadAttention`): Gemma
      2's logit soft-capping and gpt-oss's learned sink logits, one per head
      and layer (`blocks[i].attention.sink_logits`).
    dtype: computation dtype of every layer and the encoding (Flax's; None:
      inferred from inputs and parameters). Logits are float32 whatever it is.
    param_dtype: storage of every parameter; default float32.
    rngs: `nnx.Rngs` for the parameters (and dropout's forks).
  """

  def __init__(self, *, vocab_size: int, d_model: int, num_heads: int,
               num_layers: int, mlp_dim: int, encoding: str = 'none',
               max_positions: Optional[int] = None, num_kv_heads: Optional[int] = None,
               sliding_window: Optional[int] = None, implementation: str = 'auto',
               encoding_options: Optional[dict] = None,
               scalable_softmax: Optional[float] = None,
               normalization: Normalization = 'softmax',
               encoding_per_layer: Optional[bool] = None, dropout_rate: float = 0.0,
               deterministic: Optional[bool] = None,
               encoding_layers: Union[None, str, Sequence[int]] = None,
               abacus: Optional[dict] = None, logit_soft_cap: Optional[float] = None,
               sinks: bool = False, dtype=None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    check_constructor('TransformerLM', rngs=rngs, counts=(
        ('vocab_size', vocab_size), ('d_model', d_model), ('num_heads', num_heads),
        ('num_layers', num_layers), ('mlp_dim', mlp_dim)), optional_counts=(
            ('max_positions', max_positions), ('num_kv_heads', num_kv_heads),
            ('sliding_window', sliding_window)),
                      flags=(('sinks', sinks),),
                      optional_flags=(('encoding_per_layer', encoding_per_layer),
                                      ('deterministic', deterministic)),
                      rate=('dropout_rate', dropout_rate), encoding=encoding,
                      encoding_options=encoding_options)
    dtype, param_dtype = check_dtypes('TransformerLM', dtype, param_dtype)
    precision = dict(dtype=dtype, param_dtype=param_dtype)
    self.vocab_size, self.dtype, self.param_dtype = vocab_size, dtype, param_dtype
    self.embed = nnx.Embed(vocab_size, d_model,
                           embedding_init=nnx.initializers.normal(1.0), rngs=rngs,
                           embedding_metadata=annotation((VOCAB, EMBED)), **precision)
    build = lambda name: make_encoding(
        name, d_model=d_model, num_heads=num_heads, max_positions=max_positions, causal=True,
        rngs=rngs, **precision, **((encoding_options or {}) if name == encoding else {}))
    self.positional = build(encoding)
    # Absolute encodings act once, on the embeddings; blocks get the rest.
    specs = layer_specs(encoding_layers, num_layers=num_layers, encoding=encoding,
                        in_attention=self.positional.acts_in_attention,
                        sliding_window=sliding_window)
    self.layer_specs = specs  # static: each layer's (encoding name or None, window)
    self.encoding_layers = encoded_layers(specs)  # static: the layers with an encoding
    self.blocks = nnx.List([
        Block(d_model, num_heads, mlp_dim, layer_encoding, rngs=rngs,
              num_kv_heads=num_kv_heads, sliding_window=spec.window,
              implementation=implementation, scalable_softmax=scalable_softmax,
              normalization=normalization, dropout_rate=dropout_rate,
              deterministic=deterministic, logit_soft_cap=logit_soft_cap, sinks=sinks,
              **precision)
        for spec, layer_encoding in zip(specs, self._layer_encodings(
            specs, build, encoding_per_layer, encoding))])
    self.final_norm = layer_norm(d_model, rngs=rngs, **precision)
    self.unembed = linear(d_model, vocab_size, (EMBED, VOCAB), rngs=rngs, **precision)
    self.abacus = (Abacus(d_model=d_model, rngs=rngs, **precision, **abacus) if abacus
                   else None)

  @property
  def encoding(self) -> PositionalEncoding:
    """The model's positional encoding: the absolute one added to the
    embeddings, or the first encoded layer's (`blocks[i].attention.encoding`
    for each layer's; module docstring)."""
    return self.positional

  def _layer_encodings(self, specs, build, per_layer_override, encoding: str) -> list:
    """One encoding (or None) per layer: the first layer of the model's
    encoding takes `self.positional`, the first of any other name a new one;
    a later layer of a name a fresh one (its class's `per_layer`, or
    `encoding_per_layer`) or that first one."""
    first, out = {}, []
    for spec in specs:
      if spec.encoding is None:
        out.append(None)
      elif spec.encoding not in first:
        first[spec.encoding] = (self.positional if spec.encoding == encoding
                                else build(spec.encoding))
        out.append(first[spec.encoding])
      else:
        shared = first[spec.encoding]
        per_layer = type(shared).per_layer if per_layer_override is None else per_layer_override
        out.append(build(spec.encoding) if per_layer else shared)
    return out

  def __call__(self, tokens: jax.Array, *, positions: Optional[jax.Array] = None,
               return_weights: bool = False, deterministic: Optional[bool] = None,
               rngs=None, abacus_offset=None, segment_ids: Optional[jax.Array] = None,
               padding_mask: Optional[jax.Array] = None):
    """tokens int `[B, T]`; positions `[T]` or `[B, T]` (default 0 … T-1,
    or with segment_ids each token's index in its document);
    segment_ids int `[B, T]`: packed documents, each attending only to
    itself (`attention.segments`); padding_mask bool `[B, T]`, True = a real
    token: a padded token attends to nothing and nothing to it (its logits
    are those of a zero attention output, finite, to be dropped from the
    loss). Not with Abacus embeddings, whose digit runs could cross
    documents.
    `deterministic` and `rngs` (dropout) override the modules';
    `abacus_offset` int or `[B]`: the Abacus training offset k (default 0).

    Token ids outside 0 … vocab_size-1 are a ValueError when known (outside
    jit); traced ones are not checked: every embedding of a row holding one
    is NaN (`nnx.Embed`'s `jnp.take` fills that token's alone, and masked
    keys no longer reach earlier queries), so every logit of that row is
    NaN; other rows are unaffected.

    Returns logits float32 `[B, T, vocab_size]` (whatever `dtype`), and with
    `return_weights` also the list of per-layer attention weights `[B, H, T, T]`.
    """
    self._check_tokens(tokens)
    t = tokens.shape[1]
    segments = self._segments(tokens, segment_ids, padding_mask)
    if positions is None:
      positions = (np.arange(t, dtype=np.int32) if segment_ids is None
                   else segment_positions(segment_ids))
    x = self.embed(tokens)
    if not is_static(tokens):  # known ids were checked above; a traced one may be outside
      outside = jnp.any((tokens < 0) | (tokens >= self.vocab_size), axis=1)
      x = jnp.where(outside[:, None, None], jnp.asarray(jnp.nan, x.dtype), x)
    x = self.positional.add_to_embeddings(x, positions)
    if self.abacus is not None:
      x = self.abacus(x, self.abacus.ids(tokens, abacus_offset))
    elif abacus_offset is not None:
      raise ValueError('abacus_offset was given but the model has no Abacus embeddings '
                       '(TransformerLM(abacus=...)).')
    x = constrain(x, BATCH_LENGTH_EMBED)
    all_weights = []
    for block in self.blocks:
      x, weights = block(x, positions=positions, return_weights=return_weights,
                         deterministic=deterministic, rngs=rngs, segment_ids=segments)
      all_weights.append(weights)
    logits = constrain(self.unembed(self.final_norm(x)).astype(jnp.float32),
                       BATCH_LENGTH_VOCAB)
    return (logits, all_weights) if return_weights else logits

  def _segments(self, tokens, segment_ids, padding_mask):
    """(query ids, key ids) int32 `[B, T]` for the blocks, or None."""
    if segment_ids is None and padding_mask is None:
      return None
    if self.abacus is not None:
      raise ValueError('segment_ids=/padding_mask= with Abacus embeddings: a digit run '
                       'would continue from one document into the next; pack such '
                       'examples without Abacus, or one per row.')
    if padding_mask is not None:
      if np.shape(padding_mask) != tokens.shape:
        raise ValueError(f'padding_mask has shape {np.shape(padding_mask)}; it must be '
                         f'[batch, length] like tokens, {tokens.shape}.')
      return padding_ids(segment_ids, padding_mask)
    return check_segment_ids(segment_ids, None, *tokens.shape, tokens.shape[1])

  def init_cache(self, batch_size: int, cache_size: int, dtype=jnp.float32) -> list:
    """One empty key/value cache per block, for `extend`; with Abacus
    embeddings one more entry, `{'abacus_ids': int32 [B, cache_size]}` (the
    ids of the tokens in the slots: a number continues across calls)."""
    caches = [block.attention.init_cache(batch_size, cache_size, dtype)
              for block in self.blocks]
    if self.abacus is not None:
      caches.append(dict(abacus_ids=jnp.zeros((batch_size, cache_size), jnp.int32)))
    return caches

  def extend(self, tokens: jax.Array, cache: list, start, *,
             positions: Optional[jax.Array] = None,
             segment_ids: Optional[jax.Array] = None) -> tuple[jax.Array, list]:
    """Cached decoding: tokens int `[B, S]` at slots `start … start+S-1`
    (positions default to the slots) -> (logits float32 `[B, S, V]`, cache).
    Logits equal those of the full causal pass at the same positions; never
    drops. Slots outside the cache: a ValueError for a known `start`, else
    NaN logits and `cache[i]['overflow']` set (`nn.check_cache`).
    `segment_ids` int `[B, S]`: a packed prompt, several documents per row,
    each attending only to itself with positions restarting at 0 (as the
    full pass with `segment_ids`); later calls without ids continue the
    document of the slot before them (`nn.cache.cached_documents`). Not with
    Abacus embeddings (the full pass refuses them too)."""
    if segment_ids is not None and self.abacus is not None:
      raise ValueError('extend(segment_ids=...) with Abacus embeddings: a digit run would '
                       'continue from one document into the next; decode such documents '
                       'one per row.')
    self._check_tokens(tokens)
    # Checked once, not per layer.
    in_range, record = guard_slots(start, tokens.shape[1], cache[0]['key'].shape[2])
    logits, cache = self._extend(tokens, cache, start, positions=positions,
                                 segment_ids=segment_ids)
    cache = [dict(c, overflow=record(c['overflow'])) if 'overflow' in c else c
             for c in cache]
    return poison(logits, in_range), cache

  def _check_cache_positions(self, t_max: int) -> None:
    """ValueError, at trace time, if default positions over a cache of t_max
    slots can pass what the embedding encoding serves (a learned table's rows)."""
    if self.positional.acts_in_attention:
      return  # nothing is looked up per position before the blocks
    try:
      self.positional.check_position_range(0, t_max - 1)
    except ValueError as e:
      raise ValueError(f'a cache of {t_max} slots (init_cache(cache_size={t_max})) decodes '
                       f'with default positions, the slots, up to position {t_max - 1}: {e} '
                       'Make the cache no longer than the encoding serves, or pass '
                       'positions= to extend.') from None

  def _check_tokens(self, tokens) -> None:
    if tokens.ndim != 2:
      raise ValueError(f'tokens must be [batch, length], got shape {tokens.shape}.')
    if is_static(tokens) and tokens.size:
      ids = np.asarray(tokens)
      bad = ids[(ids < 0) | (ids >= self.vocab_size)]
      if bad.size:
        raise ValueError(f'token id {int(bad[0])} is outside the vocabulary 0 … '
                         f'{self.vocab_size - 1} (vocab_size={self.vocab_size}).')

  def _extend(self, tokens, cache, start, *, positions=None, segment_ids=None):
    """`extend` without the slot check, for callers that guarantee the range."""
    s_len, t_max = tokens.shape[1], cache[0]['key'].shape[2]
    documents = cached_documents(cache[0], segment_ids, start, s_len, tokens.shape[0])
    if positions is None:
      # The slots, or each token's index in its document (at most its slot).
      positions = (start + jnp.arange(s_len, dtype=jnp.int32) if documents is None
                   else documents[2])
      # The slots start … start+S-1 lie in 0 … t_max-1 whenever the step is
      # valid (else `extend` raises, or poisons its logits and records the
      # overflow), so checking the cache's last slot now, at trace time,
      # covers every position: the embedding needs no run-time (host
      # callback) check, and the cached step exports.
      self._check_cache_positions(t_max)
      with positions_proven():
        x = self.positional.add_to_embeddings(self.embed(tokens), positions)
    else:
      x = self.positional.add_to_embeddings(self.embed(tokens), positions)
    if self.abacus is not None:
      x, abacus_cache = self._add_abacus(x, tokens, cache[-1], start)
    new_cache = []
    for block, layer_cache in zip(self.blocks, cache):
      x, layer_cache = block.extend(x, layer_cache, start, positions, segment_ids)
      new_cache.append(layer_cache)
    if self.abacus is not None:
      new_cache.append(abacus_cache)
    return self.unembed(self.final_norm(x)).astype(jnp.float32), new_cache

  def _add_abacus(self, x, tokens, cache, start):
    """Abacus rows of tokens at slots start …, the run continuing from slot
    start-1 (a slot always holding the token read there) -> (x, cache)."""
    ids_cache = cache['abacus_ids']
    start = jnp.asarray(start, jnp.int32)
    before = jax.lax.dynamic_index_in_dim(ids_cache, jnp.maximum(start - 1, 0), 1, False)
    # No offset when decoding: an id is at most the slots up to it, so a cache
    # shorter than the table needs no per-step (host callback) check.
    ids = self.abacus.ids(tokens, previous_run=jnp.where(start > 0, before, 0),
                          check=ids_cache.shape[1] >= self.abacus.rows)
    return (self.abacus(x, ids),
            dict(abacus_ids=jax.lax.dynamic_update_slice_in_dim(ids_cache, ids, start, 1)))

