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

Context extension (`RopeScaling`), for evaluating past the training length
L with a factor s (typically L_eval / L): positions stay integers and the
*frequencies* change —
  'pi'   position interpolation (Chen et al. 2023): θ_i / s, i.e. position m
         is rotated as m / s;
  'ntk'  NTK-aware scaling (bloc97 2023): base · s^(D / (D - 2)), which leaves
         the fastest frequency alone and interpolates the slowest by ~s;
  'yarn' YaRN (Peng et al. 2023): per frequency, r = L / wavelength; r < α
         (α = 1): interpolate (θ/s), r > β (β = 32): keep θ, linear ramp
         between; plus the attention temperature: q and k are multiplied by
         0.1 · ln(s) + 1, so the logits by its square.
"""

import dataclasses
import math
from typing import Optional

import jax.numpy as jnp
import numpy as np

from attention_jax.positional.angles import rotation_angles
from attention_jax.positional.base import PositionalEncoding


def rope_frequencies(head_dim: int, base: float = 10000.0) -> np.ndarray:
  """θ_i = base^(-2i/head_dim), float64 `[head_dim // 2]`."""
  if head_dim < 2 or head_dim % 2:
    raise ValueError(f'RoPE needs an even head_dim >= 2, got {head_dim}.')
  return base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


SCALINGS = ('pi', 'ntk', 'yarn')


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """A context-extension method, its factor s > 0 and (YaRN) the training
  context length L in tokens."""
  method: str
  factor: float
  original_length: int = 0
  alpha: float = 1.0  # YaRN: below this many rotations over L, interpolate fully
  beta: float = 32.0  # YaRN: above this many, keep the frequency

  def __post_init__(self):
    if self.method not in SCALINGS:
      raise ValueError(f'RoPE scaling method {self.method!r}; choose one of {SCALINGS}.')
    if not self.factor > 0:
      raise ValueError(f'RoPE scaling factor must be > 0, got {self.factor}.')
    if self.method == 'yarn' and self.original_length < 1:
      raise ValueError("'yarn' needs original_length >= 1 (the training context "
                       f'length), got {self.original_length}.')


def scaled_rope_frequencies(head_dim: int, base: float,
                            scaling: Optional[RopeScaling]) -> tuple[np.ndarray, float]:
  """(θ `[head_dim // 2]` float64, q/k multiplier) for `scaling` (None: plain)."""
  if scaling is None:
    return rope_frequencies(head_dim, base), 1.0
  s = scaling.factor
  if scaling.method == 'pi':
    return rope_frequencies(head_dim, base) / s, 1.0
  if scaling.method == 'ntk':
    if head_dim == 2:
      raise ValueError("'ntk' scaling needs head_dim > 2 (its exponent is D / (D - 2)).")
    return rope_frequencies(head_dim, base * s ** (head_dim / (head_dim - 2))), 1.0
  theta = rope_frequencies(head_dim, base)
  rotations = scaling.original_length * theta / (2 * math.pi)  # L / wavelength
  ramp = np.clip((rotations - scaling.alpha) / (scaling.beta - scaling.alpha), 0.0, 1.0)
  return (1 - ramp) * theta / s + ramp * theta, 0.1 * math.log(s) + 1.0


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray,
               base: float = 10000.0, *, frequencies: Optional[np.ndarray] = None,
               ) -> jnp.ndarray:
  """Rotate `x` `[..., T, H, D]` by integer `positions` `[..., T]`.

  `positions` broadcasts against the leading axes of `x` (e.g. `[T]` for a
  whole batch, `[B, T]` per example). `frequencies` `[D/2]` replace the
  plain θ (context extension). Returns an array like `x`.
  """
  positions = jnp.asarray(positions)
  if x.ndim < 3:
    raise ValueError(f'apply_rope takes x [..., T, H, D], got shape {x.shape}.')
  if positions.ndim < 1 or positions.shape[-1] != x.shape[-3]:
    raise ValueError(
        f'positions {positions.shape} must end in the length axis of x '
        f'{x.shape} (x is [..., T, H, D], positions [..., T]).')
  if frequencies is None:
    frequencies = rope_frequencies(x.shape[-1], base)
  angles = rotation_angles(positions, frequencies)
  cos = jnp.cos(angles)[..., None, :]  # [..., T, 1, D/2]: shared by heads
  sin = jnp.sin(angles)[..., None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x.dtype)


class RoPE(PositionalEncoding):
  """'rope': rotates q and k in every attention layer."""

  def __init__(self, head_dim: int, base: float = 10000.0,
               scaling: Optional[RopeScaling] = None):
    rope_frequencies(head_dim, base)  # validate early
    self.head_dim = head_dim
    self.base = base
    # Static (part of the graph): set it to evaluate with context extension,
    # e.g. through `attention_jax.lab.evaluate.rope_scaled`.
    self.scaling = scaling

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs, base=10000.0):
    del max_positions, causal, rngs
    return cls(d_model // num_heads, base)

  def rotate_queries_keys(self, q, k, q_positions, k_positions):
    frequencies, multiplier = scaled_rope_frequencies(self.head_dim, self.base,
                                                      self.scaling)
    q = apply_rope(q, q_positions, frequencies=frequencies)
    k = apply_rope(k, k_positions, frequencies=frequencies)
    if multiplier != 1.0:  # YaRN's temperature, split between q and k
      q, k = (q * jnp.asarray(multiplier, q.dtype), k * jnp.asarray(multiplier, k.dtype))
    return q, k
