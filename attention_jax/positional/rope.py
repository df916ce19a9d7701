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
  'yarn' YaRN (Peng et al. 2023) as its official code computes it
         (github.com/jquesnelle/yarn, scaled_rope/LlamaYaRNScaledRotaryEmbedding.py;
         Hugging Face transformers' `_compute_yarn_parameters` is the same):
         the ramp is linear in the *dimension index* i = 0 … D/2 - 1, between
         the correction dimensions of β_fast = 32 and β_slow = 1 rotations
         over L, d(β) = D · ln(L / (2π β)) / (2 ln base), rounded outwards
         (low = ⌊d(32)⌋ ≥ 0, high = ⌈d(1)⌉ ≤ D - 1): indices ≤ low keep θ_i,
         indices ≥ high use θ_i / s, linear between. Attention temperature:
         the official code multiplies the cos/sin caches by
         mscale = 0.1 · ln(s) + 1 (1 for s ≤ 1), i.e. q and k are each
         multiplied by mscale and the logits by mscale².
  'yarn_paper' the ramp as the paper writes it, γ(r) linear in r = L / wavelength_i
         (r ≤ β_slow: θ/s, r ≥ β_fast: θ, linear in r between; same
         temperature). Since r is
         exponential in i, a ramp linear in r is not linear in i, and the
         official rounding widens the ramp by up to one index each side.
         Measured, max over i of |θ_paper,i - θ_official,i| / θ_official,i:
           head_dim 16, base 1e4, s = 7.2, L = 18 (the copy study): 0.81, at
             i = 0 only (2.9 turns over L: the official code keeps θ_0, the
             paper's ramp interpolates it to 0.19 θ_0); i >= 1 agree (θ/s);
           head_dim 128, base 1e4, s = 4, L = 4096 (Llama-like): 0.42, at
             i = 34 (paper 0.58 × official); they differ on i = 21 … 45
             (the ramp zone) and agree outside it.
"""

import dataclasses
import math
from typing import Optional

import jax.numpy as jnp
import numpy as np

from attention_jax.positional.angles import rotation_angles
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import real_option


def rope_frequencies(head_dim: int, base: float = 10000.0) -> np.ndarray:
  """θ_i = base^(-2i/head_dim), float64 `[head_dim // 2]`."""
  if head_dim < 2 or head_dim % 2:
    raise ValueError(f'RoPE needs an even head_dim >= 2, got {head_dim}.')
  base = real_option('rope', 'base', base, above=1,
                     why='θ_i = base^(-2i/D) must fall with i; the usual base is 10000')
  return base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


SCALINGS = ('pi', 'ntk', 'yarn', 'yarn_paper')


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """A context-extension method, its factor s > 0 and (YaRN) the training
  context length L in tokens (the official code's
  `original_max_position_embeddings`)."""
  method: str
  factor: float
  original_length: int = 0
  beta_fast: float = 32.0  # YaRN: at or above this many rotations over L, keep θ
  beta_slow: float = 1.0  # YaRN: at or below this many, interpolate fully (θ / s)

  def __post_init__(self):
    if self.method not in SCALINGS:
      raise ValueError(f'RoPE scaling method {self.method!r}; choose one of {SCALINGS}.')
    if not self.factor > 0:
      raise ValueError(f'RoPE scaling factor must be > 0, got {self.factor}.')
    if self.method.startswith('yarn') and self.original_length < 1:
      raise ValueError(f"{self.method!r} needs original_length >= 1 (the training context "
                       f'length), got {self.original_length}.')
    if self.method.startswith('yarn') and not 0 < self.beta_slow < self.beta_fast:
      raise ValueError(f'YaRN needs 0 < beta_slow < beta_fast, got beta_slow='
                       f'{self.beta_slow}, beta_fast={self.beta_fast}.')


def yarn_temperature(factor: float) -> float:
  """YaRN's q/k multiplier (the official `get_mscale`): 0.1 · ln(s) + 1, and
  1 for s <= 1. The logits are multiplied by its square."""
  return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def _yarn_correction_dim(rotations: float, head_dim: int, base: float, length: int) -> float:
  """The (fractional) index i at which θ_i makes `rotations` turns over `length`."""
  return head_dim * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_ramp(head_dim: int, base: float, scaling: RopeScaling) -> np.ndarray:
  """Per frequency, the interpolated share `[head_dim // 2]` in [0, 1]
  (0: keep θ_i, 1: θ_i / s) of 'yarn' (linear in the index, official code)
  or 'yarn_paper' (linear in the rotations over L)."""
  if scaling.method == 'yarn_paper':
    rotations = scaling.original_length * rope_frequencies(head_dim, base) / (2 * math.pi)
    return np.clip((scaling.beta_fast - rotations) / (scaling.beta_fast - scaling.beta_slow),
                   0.0, 1.0)
  low = max(math.floor(_yarn_correction_dim(scaling.beta_fast, head_dim, base,
                                            scaling.original_length)), 0)
  high = min(math.ceil(_yarn_correction_dim(scaling.beta_slow, head_dim, base,
                                            scaling.original_length)), head_dim - 1)
  if low == high:
    high += 0.001  # as the official code: no division by zero
  return np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)


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
  ramp = yarn_ramp(head_dim, base, scaling)
  return (1 - ramp) * theta + ramp * theta / s, yarn_temperature(s)


def check_rotary_inputs(name: str, x: jnp.ndarray, positions) -> jnp.ndarray:
  """`positions` as an array, after checking that x is `[..., T, H, D]` and
  positions `[..., T]` (a ValueError naming `name` otherwise)."""
  positions = jnp.asarray(positions)
  if x.ndim < 3:
    raise ValueError(f'{name} takes x [..., T, H, D], got shape {x.shape}.')
  if positions.ndim < 1 or positions.shape[-1] != x.shape[-3]:
    raise ValueError(
        f'positions {positions.shape} must end in the length axis of x '
        f'{x.shape} (x is [..., T, H, D], positions [..., T]).')
  return positions


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray,
               base: float = 10000.0, *, frequencies: Optional[np.ndarray] = None,
               ) -> jnp.ndarray:
  """Rotate `x` `[..., T, H, D]` by integer `positions` `[..., T]`.

  `positions` broadcasts against the leading axes of `x` (e.g. `[T]` for a
  whole batch, `[B, T]` per example). `frequencies` `[D/2]` replace the
  plain θ (context extension). Returns an array like `x`.
  """
  positions = check_rotary_inputs('apply_rope', x, positions)
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
    self.base = float(base)
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
