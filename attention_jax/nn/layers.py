"""The pieces of a pre-LayerNorm transformer: the block (causal
self-attention and a GELU MLP, each a residual branch) and the LayerNorm and
Linear layers whose parameters name their axes for sharding
(`nn.sharding`). `TransformerLM` stacks the blocks; `TransformerEncoder` and
`Seq2Seq` reuse the layers."""

from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax.nn.attention import MultiHeadAttention
from attention_jax.nn.arguments import resolve_deterministic
from attention_jax.nn.sharding import BATCH_LENGTH_MLP
from attention_jax.nn.sharding import constrain
from attention_jax.positional import PositionalEncoding
from attention_jax.positional.parameters import EMBED
from attention_jax.positional.parameters import MLP
from attention_jax.positional.parameters import NORM
from attention_jax.positional.parameters import annotation


class Block(nnx.Module):
  """Pre-LN transformer block: causal self-attention and a GELU MLP, each
  residual branch dropped at `dropout_rate` (as are the attention weights)."""

  def __init__(self, d_model: int, num_heads: int, mlp_dim: int,
               positional: Optional[PositionalEncoding], *, rngs: nnx.Rngs,
               dropout_rate: float = 0.0, deterministic: Optional[bool] = None,
               dtype=None, param_dtype=jnp.float32, **attention_options):
    precision = dict(dtype=dtype, param_dtype=param_dtype)
    self.attention_norm = layer_norm(d_model, rngs=rngs, **precision)
    self.attention = MultiHeadAttention(d_model, num_heads, causal=True, encoding=positional,
                                        dropout_rate=dropout_rate,
                                        deterministic=deterministic,
                                        rngs=rngs, **precision, **attention_options)
    self.mlp_norm = layer_norm(d_model, rngs=rngs, **precision)
    self.mlp_in = linear(d_model, mlp_dim, (EMBED, MLP), rngs=rngs, **precision)
    self.mlp_out = linear(mlp_dim, d_model, (MLP, EMBED), rngs=rngs, **precision)
    self.dropout_rate, self.deterministic = float(dropout_rate), deterministic
    # Forked only when dropping: rate 0 leaves the parameters' RNG untouched.
    self.rngs = rngs.dropout.fork() if dropout_rate > 0 else nnx.data(None)

  def __call__(self, x, *, positions, return_weights, deterministic=None, rngs=None,
               segment_ids=None):
    """x `[B, T, d_model]` -> (`[B, T, d_model]`, weights `[B, H, T, T]` or None);
    segment_ids None or (query ids, key ids), int `[B, T]` each."""
    q_ids, kv_ids = (None, None) if segment_ids is None else segment_ids
    h = self.attention(self.attention_norm(x), positions=positions,
                       return_weights=return_weights, deterministic=deterministic,
                       rngs=rngs, segment_ids=q_ids, context_segment_ids=kv_ids)
    h, weights = h if return_weights else (h, None)
    drop = self._residual_dropout(deterministic, rngs)
    return self._mlp(x + drop(h), drop), weights

  def _residual_dropout(self, deterministic, rngs):
    if resolve_deterministic(self.dropout_rate, deterministic, self.deterministic):
      return lambda h: h
    rngs = self.rngs if rngs is None else rngs
    return lambda h: nnx.Dropout(self.dropout_rate)(h, deterministic=False, rngs=rngs)

  def extend(self, x, cache, start, positions, segment_ids=None):
    """Cached decoding (see `MultiHeadAttention.extend`; slots checked by
    the caller) -> (x, cache)."""
    h, cache = self.attention._extend(self.attention_norm(x), cache, start,  # pylint: disable=protected-access
                                      positions=positions, segment_ids=segment_ids)
    return self._mlp(x + h), cache

  def _mlp(self, x, drop=lambda h: h):
    hidden = constrain(self.mlp_in(self.mlp_norm(x)), BATCH_LENGTH_MLP)
    return x + drop(self.mlp_out(jax.nn.gelu(hidden)))


def layer_norm(width: int, *, rngs, dtype, param_dtype, **options) -> nnx.LayerNorm:
  """`nnx.LayerNorm` with its scale and bias named 'norm' (statistics in
  float32 whatever `dtype`: Flax's default)."""
  return nnx.LayerNorm(width, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                       scale_metadata=annotation((NORM,)), bias_metadata=annotation((NORM,)),
                       **options)


def linear(d_in: int, d_out: int, axes: tuple, *, rngs, dtype, param_dtype,
           **options) -> nnx.Linear:
  """`nnx.Linear` whose kernel's axes are `axes` and bias's `axes[1:]`."""
  return nnx.Linear(d_in, d_out, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                    kernel_metadata=annotation(axes), bias_metadata=annotation(axes[1:]),
                    **options)
