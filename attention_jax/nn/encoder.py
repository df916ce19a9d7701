"""A bidirectional transformer encoder that writes every output at once: the
model of Delétang et al. 2023 and Ruoss et al. 2023
(google-deepmind/randomized_positional_encodings, `models/transformer.py`
`TransformerEncoder` and `make_transformer`).

Post-LayerNorm blocks, as theirs:

    h = LayerNorm(h + dropout(MHA(h)))
    h = LayerNorm(h + dropout(W_2 relu(W_1 h)))

with bias-free Q/K/V/O projections, an FFN `mlp_dim` wide (theirs: 4 ×
d_model) with biases, dropout on the embeddings only when an encoding is
added to them (sinusoidal, learned and their randomized forms: theirs
`add_positional_encodings` returns the bare embeddings for RoPE, relative,
ALiBi and none) and on both residual branches (none on the attention weights), no
final LayerNorm, and a linear head with a bias to `output_size` classes at
every position. Token embeddings are drawn from a normal truncated at ±2
standard deviations with stddev 0.02 (Haiku's `TruncatedNormal`, which does
not rescale for the truncation) and multiplied by √d_model; the other
weights use Haiku's default, the same truncated normal with stddev
1/√fan_in; LayerNorm's epsilon is Haiku's 1e-5.

Positions: `positions` `[T]` or `[B, T]` for every layer, or
`layer_positions` `[num_layers, T]` / `[num_layers, B, T]`, one set per layer
(the official randomized RoPE draws anew in each layer; an encoding added to
the embeddings reads the first). `distances` `[num_layers, T, T]` (or
`[num_layers, B, T, T]`): signed
distances per layer for encodings that read them (randomized ALiBi and
relative, `ScoreContext.distances`). Padding: keys at index >= `lengths[b]`
are masked (`kv_lengths`), so a batch padded past its examples attends as
the unpadded one does.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.nn.arguments import check_constructor
from attention_jax.nn.attention import MultiHeadAttention
from attention_jax.nn.sharding import BATCH_LENGTH_EMBED
from attention_jax.nn.sharding import BATCH_LENGTH_MLP
from attention_jax.nn.sharding import constrain
from attention_jax.nn.layers import layer_norm
from attention_jax.nn.layers import linear
from attention_jax.positional import make_encoding
from attention_jax.positional.base import haiku_truncated_normal
from attention_jax.positional.parameters import EMBED
from attention_jax.positional.parameters import MLP
from attention_jax.positional.parameters import VOCAB
from attention_jax.positional.parameters import annotation
from attention_jax.positional.parameters import check_dtypes
from attention_jax.positional.base import hooks_of


def _linear(d_in, d_out, axes, rngs, precision, use_bias=True):
  return linear(d_in, d_out, axes, use_bias=use_bias, kernel_init=haiku_truncated_normal(),
                rngs=rngs, **precision)


class EncoderBlock(nnx.Module):
  """Post-LN block: bidirectional self-attention, then a ReLU FFN."""

  def __init__(self, d_model, num_heads, mlp_dim, encoding, *, dropout_rate, rngs,
               precision):
    self.attention = MultiHeadAttention(d_model, num_heads, causal=False, encoding=encoding,
                                        rngs=rngs, **precision)
    for name in ('W_Q', 'W_K', 'W_V', 'W_O'):  # Haiku's Linear init, as theirs
      kernel = getattr(self.attention, name).kernel
      kernel[...] = haiku_truncated_normal(1.0 / np.sqrt(d_model))(
          rngs.params(), kernel[...].shape, precision['param_dtype'])
    self.attention_norm = layer_norm(d_model, epsilon=1e-5, rngs=rngs, **precision)
    self.mlp_in = _linear(d_model, mlp_dim, (EMBED, MLP), rngs, precision)
    self.mlp_out = _linear(mlp_dim, d_model, (MLP, EMBED), rngs, precision)
    self.mlp_norm = layer_norm(d_model, epsilon=1e-5, rngs=rngs, **precision)
    self.dropout = nnx.Dropout(dropout_rate)

  def __call__(self, h, *, positions, distances, kv_lengths, deterministic, rngs):
    """h `[B, T, d_model]` -> `[B, T, d_model]`."""
    a = self.attention(h, positions=positions, distances=distances, kv_lengths=kv_lengths)
    h = self.attention_norm(h + self.dropout(a, deterministic=deterministic, rngs=rngs))
    f = self.mlp_out(jax.nn.relu(constrain(self.mlp_in(h), BATCH_LENGTH_MLP)))
    return self.mlp_norm(h + self.dropout(f, deterministic=deterministic, rngs=rngs))


class TransformerEncoder(nnx.Module):
  """tokens `[B, T]` -> logits float32 `[B, T, output_size]`, bidirectional.

  Args:
    vocab_size: input token ids 0 … vocab_size-1.
    output_size: classes of the head.
    d_model, num_heads, num_layers, mlp_dim: sizes (theirs: 64, 8, 5, 256).
    encoding: a registry name; one built with `causal=False` (an encoding
      that is causal by construction refuses, naming why). One instance per
      layer (the official layers each hold their own relative parameters).
    max_positions: positions the encoding must serve (randomized: the
      noise range, theirs 2,048).
    encoding_options: keyword options of the encoding's `build`.
    dropout_rate: theirs 0.1; it drops only in a call with
      `deterministic=False` and `rngs=nnx.Rngs(dropout=…)` (training).
    dtype: computation dtype of every layer (Flax's; None: inferred from the
      inputs and parameters); LayerNorm statistics and softmax stay float32,
      the logits are float32 whatever it is.
    param_dtype: storage of every parameter; default float32.
    rngs: `nnx.Rngs` for the parameters.
  """

  def __init__(self, *, vocab_size: int, output_size: int, d_model: int, num_heads: int,
               num_layers: int, mlp_dim: int, encoding: str = 'none',
               max_positions: Optional[int] = None, encoding_options: Optional[dict] = None,
               dropout_rate: float = 0.0, dtype=None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    check_constructor('TransformerEncoder', rngs=rngs, counts=(
        ('vocab_size', vocab_size), ('output_size', output_size), ('d_model', d_model),
        ('num_heads', num_heads), ('num_layers', num_layers), ('mlp_dim', mlp_dim)),
                      optional_counts=(('max_positions', max_positions),),
                      rate=('dropout_rate', dropout_rate), encoding=encoding,
                      encoding_options=encoding_options)
    dtype, param_dtype = check_dtypes('TransformerEncoder', dtype, param_dtype)
    precision = dict(dtype=dtype, param_dtype=param_dtype)
    self.vocab_size, self.num_layers = vocab_size, num_layers
    self.dtype, self.param_dtype = dtype, param_dtype
    self.embed = nnx.Embed(vocab_size, d_model, embedding_init=haiku_truncated_normal(0.02),
                           embedding_metadata=annotation((VOCAB, EMBED)), rngs=rngs,
                           **precision)
    self.scale = float(np.sqrt(d_model))
    build = lambda: make_encoding(encoding, d_model=d_model, num_heads=num_heads,
                                  max_positions=max_positions, causal=False, rngs=rngs,
                                  **precision, **(encoding_options or {}))
    self.positional = build()
    in_attention = self.positional.acts_in_attention
    self.blocks = nnx.List([
        EncoderBlock(d_model, num_heads, mlp_dim,
                     (self.positional if i == 0 else build()) if in_attention else None,
                     dropout_rate=dropout_rate, rngs=rngs, precision=precision)
        for i in range(num_layers)])
    self.dropout = nnx.Dropout(dropout_rate)
    # Theirs drops the embeddings where it adds an encoding to them, only there.
    self.drops_embeddings = 'add_to_embeddings' in hooks_of(type(self.positional))
    self.head = _linear(d_model, output_size, (EMBED, VOCAB), rngs, precision)

  def __call__(self, tokens: jax.Array, *, lengths: Optional[jax.Array] = None,
               positions: Optional[jax.Array] = None,
               layer_positions: Optional[jax.Array] = None,
               distances: Optional[jax.Array] = None,
               deterministic: bool = True, rngs: Optional[nnx.Rngs] = None) -> jax.Array:
    """tokens int `[B, T]`; lengths int `[B]` (keys past them are padding);
    positions `[T]` / `[B, T]` for every layer, or layer_positions `[L, T]` /
    `[L, B, T]` one set per layer (the embeddings read layer 0's);
    distances `[L, T, T]` / `[L, B, T, T]` per layer."""
    if tokens.ndim != 2:
      raise ValueError(f'tokens must be [batch, length], got shape {tokens.shape}.')
    if not deterministic and rngs is None:
      raise ValueError('deterministic=False (dropout) needs the call\'s rngs, e.g. '
                       'rngs=nnx.Rngs(dropout=0).')
    t, n = tokens.shape[1], self.num_layers
    if positions is not None and layer_positions is not None:
      raise ValueError('give positions (shared by the layers) or layer_positions, not both.')
    if layer_positions is not None:
      _check_layers('layer_positions', layer_positions, n, (t,))
      per_layer = list(layer_positions)
    else:
      per_layer = [np.arange(t, dtype=np.int32) if positions is None else positions] * n
    if distances is not None:
      _check_layers('distances', distances, n, (t, t))
    h = self.positional.add_to_embeddings(self.embed(tokens) * self.scale, per_layer[0])
    if self.drops_embeddings:
      h = self.dropout(h, deterministic=deterministic, rngs=rngs)
    h = constrain(h, BATCH_LENGTH_EMBED)
    for i, block in enumerate(self.blocks):
      h = block(h, positions=per_layer[i], distances=None if distances is None else distances[i],
                kv_lengths=lengths, deterministic=deterministic, rngs=rngs)
    return self.head(h).astype(jnp.float32)


def _check_layers(name: str, values, num_layers: int, trailing: tuple) -> None:
  """ValueError unless `values` is `[num_layers, (B,) *trailing]`."""
  shape = tuple(np.shape(values))
  if (len(shape) not in (1 + len(trailing), 2 + len(trailing)) or shape[0] != num_layers
      or shape[len(shape) - len(trailing):] != trailing):
    raise ValueError(f'{name} of shape {shape}: expected [{num_layers}, (batch,) '
                     f'{", ".join(map(str, trailing))}] (one per layer).')
