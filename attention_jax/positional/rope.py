"""Rotary position embedding, RoPE (Su et al. 2021).

q and k (never v) are rotated pairwise by angles `position * θ_i` with
θ_i = base^(-2i/D), i = 0 … D/2 - 1, so that ⟨R(m) q, R(n) k⟩ depends on
m - n only.

Pairing convention: **split halves** (GPT-NeoX, LLaMA in Hugging Face):
dimension i is paired with dimension i + D/2, not with its neighbour i+1 as in
RoFormer's interleaved pairs. The two are the same rotation up to a fixed
permutation of q's and k's features, which a learned projection absorbs; split
halves needs no strided gather.

Angles and sin/cos are float32 whatever the input dtype, with the angle reduced
modulo 2π exactly (see `angles.py`); the result is cast back to the input dtype.
"""

import jax.numpy as jnp
import numpy as np

from attention_jax.positional.angles import rotation_angles
from attention_jax.positional.base import PositionalEncoding


def rope_frequencies(head_dim: int, base: float = 10000.0) -> np.ndarray:
  """θ_i = base^(-2i/head_dim), float64 `[head_dim // 2]`."""
  if head_dim < 2 or head_dim % 2:
    raise ValueError(f'RoPE needs an even head_dim >= 2, got {head_dim}.')
  return base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray,
               base: float = 10000.0) -> jnp.ndarray:
  """Rotate `x` `[..., T, H, D]` by integer `positions` `[..., T]`.

  `positions` broadcasts against the leading axes of `x` (e.g. `[T]` for a
  whole batch, `[B, T]` per example). Returns an array like `x`.
  """
  positions = jnp.asarray(positions)
  if x.ndim < 3:
    raise ValueError(f'apply_rope takes x [..., T, H, D], got shape {x.shape}.')
  if positions.ndim < 1 or positions.shape[-1] != x.shape[-3]:
    raise ValueError(
        f'positions {positions.shape} must end in the length axis of x '
        f'{x.shape} (x is [..., T, H, D], positions [..., T]).')
  angles = rotation_angles(positions, rope_frequencies(x.shape[-1], base))
  cos = jnp.cos(angles)[..., None, :]  # [..., T, 1, D/2]: shared by heads
  sin = jnp.sin(angles)[..., None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x.dtype)


class RoPE(PositionalEncoding):
  """'rope': rotates q and k in every attention layer."""

  def __init__(self, head_dim: int, base: float = 10000.0):
    rope_frequencies(head_dim, base)  # validate early
    self.head_dim = head_dim
    self.base = base

  @classmethod
  def build(cls, *, d_model, num_heads, max_length, causal, rngs, base=10000.0):
    del max_length, causal, rngs
    return cls(d_model // num_heads, base)

  def rotate_queries_keys(self, q, k, q_positions, k_positions):
    return (apply_rope(q, q_positions, self.base),
            apply_rope(k, k_positions, self.base))
