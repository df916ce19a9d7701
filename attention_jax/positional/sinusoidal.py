"""Sinusoidal absolute encoding (Vaswani et al. 2017; lesson 7.4).

PE(pos, 2i) = sin(pos / 10000^(2i/d)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

Computed on the fly in float32 for any position (no table, no length limit),
with angles reduced modulo 2π exactly (see `angles.py`), so position 100,000
is as accurate as position 1.
"""

import jax.numpy as jnp
import numpy as np

from attention_jax.positional.angles import rotation_angles
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import real_option


def sinusoidal_frequencies(dim: int, base: float = 10000.0) -> np.ndarray:
  """ω_i = base^(-2i/dim) for i = 0 … ceil(dim/2) - 1, float64 `[ceil(dim/2)]`."""
  if dim < 1:
    raise ValueError(f'dim must be >= 1, got {dim}.')
  base = real_option('sinusoidal', 'base', base, above=1,
                     why='ω_i = base^(-2i/d) must fall with i; the usual base is 10000')
  return base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)


def sinusoidal_at(positions: jnp.ndarray, dim: int, base: float = 10000.0) -> jnp.ndarray:
  """Integer positions `[...]` -> float32 encodings `[..., dim]` (sin on even
  dims, cos on odd; an odd `dim` ends with a sin)."""
  angles = rotation_angles(positions, sinusoidal_frequencies(dim, base))
  pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)
  return pe.reshape(*angles.shape[:-1], 2 * angles.shape[-1])[..., :dim]


def sinusoidal(length: int, dim: int, base: float = 10000.0) -> jnp.ndarray:
  """The lesson's table for positions 0 … length-1: float32 `[length, dim]`."""
  if length < 0:
    raise ValueError(f'length must be >= 0, got {length}.')
  return sinusoidal_at(np.arange(length, dtype=np.int32), dim, base)


class Sinusoidal(PositionalEncoding):
  """'sinusoidal': adds `sinusoidal_at(positions, d_model)` to the embeddings."""

  def __init__(self, d_model: int, base: float = 10000.0):
    sinusoidal_frequencies(d_model, base)  # validate early
    self.d_model = d_model
    self.base = float(base)

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs, base=10000.0):
    del num_heads, max_positions, causal, rngs
    return cls(d_model, base)

  def add_to_embeddings(self, x, positions):
    pe = sinusoidal_at(positions, self.d_model, self.base)
    return x + pe.astype(x.dtype)
