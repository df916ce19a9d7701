"""A decoder-only transformer LM built from the library's modules.

Pre-LayerNorm blocks (x + MHA(LN(x)), then x + MLP(LN(x))), a final
LayerNorm and an *untied* output projection: tying would make the input
embedding double as the classifier, coupling the two in a way that differs
between encodings that add to the embeddings and those that do not.

The positional encoding is chosen by name and built once; every attention
layer shares the same object, so its hooks (and a learned table's single
parameter) are the same in all layers.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention import causal_mask
from attention_jax.nn.attention import MultiHeadAttention
from attention_jax.positional import PositionalEncoding
from attention_jax.positional import make_encoding


class Block(nnx.Module):
  """Pre-LN transformer block: causal self-attention and a GELU MLP."""

  def __init__(self, d_model: int, num_heads: int, mlp_dim: int,
               positional: PositionalEncoding, *, rngs: nnx.Rngs):
    self.attention_norm = nnx.LayerNorm(d_model, rngs=rngs)
    self.attention = MultiHeadAttention(d_model, num_heads, positional=positional,
                                        rngs=rngs)
    self.mlp_norm = nnx.LayerNorm(d_model, rngs=rngs)
    self.mlp_in = nnx.Linear(d_model, mlp_dim, rngs=rngs)
    self.mlp_out = nnx.Linear(mlp_dim, d_model, rngs=rngs)

  def __call__(self, x, *, mask, positions):
    """x `[B, T, d_model]` -> (`[B, T, d_model]`, weights `[B, H, T, T]`)."""
    h, weights = self.attention(self.attention_norm(x), mask=mask, positions=positions)
    x = x + h
    x = x + self.mlp_out(jax.nn.gelu(self.mlp_in(self.mlp_norm(x))))
    return x, weights


class TransformerLM(nnx.Module):
  """Causal LM: tokens `[B, T]` -> logits `[B, T, vocab_size]`.

  Args:
    vocab_size: number of token ids.
    d_model, num_heads, num_layers, mlp_dim: the usual sizes.
    encoding: a registry name ('none', 'sinusoidal', 'learned', 'rope', 'alibi', …).
    max_length: positions the model must handle; sizes a learned table (its
      rows past the training lengths are never trained — which is what a
      length-extrapolation study measures).
    rngs: `nnx.Rngs` for the parameters.
  """

  batch_layout = 'decoder_only'

  def __init__(self, *, vocab_size: int, d_model: int, num_heads: int,
               num_layers: int, mlp_dim: int, encoding: str,
               max_length: Optional[int], rngs: nnx.Rngs):
    self.embed = nnx.Embed(vocab_size, d_model,
                           embedding_init=nnx.initializers.normal(1.0), rngs=rngs)
    self.positional = make_encoding(encoding, d_model=d_model, num_heads=num_heads,
                                    max_length=max_length, causal=True, rngs=rngs)
    self.blocks = nnx.List([
        Block(d_model, num_heads, mlp_dim, self.positional, rngs=rngs)
        for _ in range(num_layers)])
    self.final_norm = nnx.LayerNorm(d_model, rngs=rngs)
    self.unembed = nnx.Linear(d_model, vocab_size, rngs=rngs)

  def __call__(self, tokens: jax.Array, *, positions: Optional[jax.Array] = None,
               return_weights: bool = False):
    """tokens int `[B, T]`; positions `[T]` or `[B, T]` (default 0 … T-1).

    Returns logits float32 `[B, T, vocab_size]`, and with `return_weights`
    also the list of per-layer attention weights `[B, H, T, T]`.
    """
    if tokens.ndim != 2:
      raise ValueError(f'tokens must be [batch, length], got shape {tokens.shape}.')
    t = tokens.shape[1]
    if positions is None:
      positions = np.arange(t, dtype=np.int32)
    x = self.positional.add_to_embeddings(self.embed(tokens), positions)
    mask = causal_mask(t)
    all_weights = []
    for block in self.blocks:
      x, weights = block(x, mask=mask, positions=positions)
      all_weights.append(weights)
    logits = self.unembed(self.final_norm(x)).astype(jnp.float32)
    return (logits, all_weights) if return_weights else logits

  def forward_batch(self, batch) -> jax.Array:
    """Logits aligned with `batch['targets']` (the `decoder_only` layout)."""
    return self(batch['inputs'])

  def predict_batch(self, batch) -> jax.Array:
    """Teacher-forced argmax predictions aligned with `batch['targets']`."""
    return jnp.argmax(self.forward_batch(batch), -1).astype(jnp.int32)
