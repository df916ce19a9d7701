"""Lesson 7.2's single-head `SelfAttention`, and how a module resolves its
positional encoding (`resolve_encoding`, shared with `MultiHeadAttention`)."""

from typing import Optional, Union

import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.nn.arguments import check_constructor
from attention_jax.attention import check_options
from attention_jax.attention import scaled_dot_product_attention
from attention_jax.attention.heads import as_rank4
from attention_jax.positional import ENCODINGS
from attention_jax.positional import NoPE
from attention_jax.positional import PositionalEncoding
from attention_jax.positional import make_encoding
from attention_jax.positional.base import ScoreContext
from attention_jax.positional.base import embedding_only
from attention_jax.positional.parameters import EMBED
from attention_jax.positional.parameters import KV
from attention_jax.positional.parameters import annotation
from attention_jax.positional.parameters import check_dtypes

Positional = Union[str, PositionalEncoding, None]


def _refuse_embedding_encoding(cls: type, label: str, owner: str):
  if embedding_only(cls):
    raise ValueError(
        f'encoding {label} is added to the embeddings, not inside attention, so '
        f'{owner} cannot use it: give it to the model (e.g. TransformerLM('
        f'encoding={label})) or add it before attention with '
        '`encoding.add_to_embeddings(x, positions)`.')


def resolve_encoding(encoding: Positional, *, d_model, num_heads, max_positions, causal,
                     rngs, owner, options: Optional[dict] = None, dtype=None,
                     param_dtype=jnp.float32) -> PositionalEncoding:
  """The encoding an attention module `owner` uses: built from a name with the
  module's `causal`, `dtype` and `param_dtype` (and `options`, the keywords of
  its `build`), or checked to agree with it; never one that only adds to the
  embeddings. One given built keeps the dtypes it was built with."""
  if options and not isinstance(encoding, str):
    raise ValueError(f'encoding_options={options!r} are keywords for building an encoding '
                     f'from its name, but encoding={encoding!r} is not a name: give the '
                     'name, or build the encoding with make_encoding(name, ..., **options).')
  if encoding is None:
    return NoPE()
  if isinstance(encoding, str):
    cls = ENCODINGS.get(encoding)
    if cls is not None:  # refuse before building: 'learned' would ask for a length
      _refuse_embedding_encoding(cls, repr(encoding), owner)
    return make_encoding(encoding, d_model=d_model, num_heads=num_heads,
                         max_positions=max_positions, causal=causal, rngs=rngs,
                         dtype=dtype, param_dtype=param_dtype, **(options or {}))
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
    dtype, param_dtype: as in `MultiHeadAttention` (Flax's: computation
      dtype, None inferred from the input and parameters; parameter storage,
      default float32).
    rngs: `nnx.Rngs` for the parameters.
  """

  def __init__(self, d_model: int, d_k: int, *, d_v: Optional[int] = None,
               encoding: Positional = None, causal: bool = True,
               max_positions: Optional[int] = None, dtype=None,
               param_dtype=jnp.float32, implementation: str = 'auto',
               rngs: nnx.Rngs):
    check_options(implementation)
    check_constructor('SelfAttention', rngs=rngs, counts=(('d_model', d_model), ('d_k', d_k)),
                      optional_counts=(('d_v', d_v), ('max_positions', max_positions)),
                      flags=(('causal', causal),), encoding=encoding)
    dtype, param_dtype = check_dtypes('SelfAttention', dtype, param_dtype)
    self.dtype, self.param_dtype = dtype, param_dtype
    proj = dict(use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                kernel_metadata=annotation((EMBED, KV)))
    self.d_model, self.causal, self.implementation = d_model, bool(causal), implementation
    self.W_Q = nnx.Linear(d_model, d_k, **proj)
    self.W_K = nnx.Linear(d_model, d_k, **proj)
    self.W_V = nnx.Linear(d_model, d_v or d_k, **proj)
    self.positional = resolve_encoding(
        encoding, d_model=d_k, num_heads=1, max_positions=max_positions,
        causal=self.causal, rngs=rngs, owner='SelfAttention', dtype=dtype,
        param_dtype=param_dtype)

  @property
  def encoding(self) -> PositionalEncoding:
    """The encoding acting in this attention (`NoPE` for none); its
    parameters sit at `positional.<name>` in `nnx.state(module)`."""
    return self.positional

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
        causal=self.causal, mask=as_rank4('mask', head_axis(mask)),
        q_history=q if self.positional.reads_query_history else None))
    result = scaled_dot_product_attention(
        q, k, v, mask=head_axis(mask), bias=head_axis(bias),
        score_bias=score_bias, causal=self.causal,
        implementation=self.implementation, return_weights=return_weights)
    if return_weights:
      return result[0][:, :, 0, :], result[1][:, 0]
    return result[:, :, 0, :]
