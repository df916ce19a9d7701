"""The interface every positional encoding implements: three optional hooks.

An encoding contributes to a transformer in at most three places, so the
attention code never needs to ask which encoding it is:

* `add_to_embeddings` — absolute encodings (sinusoidal, learned) add a vector
  to each token embedding before the first block;
* `rotate_queries_keys` — RoPE rotates q and k inside every attention layer;
* `attention_bias` — relative biases (ALiBi) add to the attention scores.

Positions are integer arrays `[T]` (shared by the batch) or `[B, T]`. Modules
default them to `np.arange(T)`: a static array, so length checks happen at
trace time even under `jax.jit`.
"""

from typing import Optional

import jax.numpy as jnp
import numpy as np
from flax import nnx


class PositionalEncoding(nnx.Module):
  """Base class; each hook defaults to "no contribution". Also 'none' (NoPE)."""

  #: Largest number of positions the encoding can represent (None: unlimited).
  max_positions: Optional[int] = None

  def add_to_embeddings(self, x: jnp.ndarray, positions: jnp.ndarray) -> jnp.ndarray:
    """x `[B, T, D]`, positions `[T]` or `[B, T]` -> `[B, T, D]`."""
    del positions
    return x

  def rotate_queries_keys(
      self, q: jnp.ndarray, k: jnp.ndarray, q_positions: jnp.ndarray,
      k_positions: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """q `[B, T_q, H, D]`, k `[B, T_k, H, D]` -> rotated (q, k), same shapes."""
    del q_positions, k_positions
    return q, k

  def attention_bias(
      self, q_positions: jnp.ndarray, k_positions: jnp.ndarray) -> Optional[jnp.ndarray]:
    """-> float32 bias `[H, T_q, T_k]` (or `[B, H, T_q, T_k]`), or None."""
    del q_positions, k_positions
    return None

  def linear_bias_slopes(self) -> Optional[np.ndarray]:
    """Per-head slopes s `[H]` when `attention_bias` is exactly
    `-s_h · (q_position - k_position)`, so blockwise attention can rebuild it
    block by block; None when the encoding has another bias (or none)."""
    return None

  @property
  def has_attention_bias(self) -> bool:
    return type(self).attention_bias is not PositionalEncoding.attention_bias


class NoPE(PositionalEncoding):
  """'none': no positional information at all (a causal mask still breaks
  permutation symmetry; Kazemnejad et al. 2023 find it extrapolates well)."""

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs):
    del d_model, num_heads, max_positions, causal, rngs
    return cls()
