"""Rotation angles `position * frequency`, reduced modulo 2π exactly.

Sinusoidal encodings and RoPE both need `sin` and `cos` of `p * ω` for integer
positions `p` and static frequencies `ω`. The obvious float32 product loses the
angle at long lengths: at p = 10,000 one float32 ulp of `p * ω` is about 1e-3
rad, so the encoding of position 10,000 is already wrong in the third digit —
exactly the lengths a length-extrapolation study looks at.

We instead compute the angle in *turns* as a 64-bit fixed-point fraction with
uint32 arithmetic (which wraps modulo 2^32 — the integer part of the product is
thrown away for free), and only then convert the reduced angle, which lies in
[-π, π), to float32. The result is within about 2e-7 rad of the exact angle for
every |p| < 2^31, whatever the frequency.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

_TWO_32 = 2.0**32


def _split_turns(frequencies: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Static float64 frequencies (rad/position) -> (hi, lo) uint32 words.

  `ω / 2π mod 1 ≈ (hi + lo / 2^32) / 2^32`: 64 fractional bits of the turn
  per position, of which float64 supplies the leading 53.
  """
  turns = np.mod(np.asarray(frequencies, np.float64) / (2.0 * math.pi), 1.0)
  hi = np.floor(turns * _TWO_32)
  lo = np.floor((turns * _TWO_32 - hi) * _TWO_32)
  return hi.astype(np.uint32), lo.astype(np.uint32)


def _mul_hi_u32(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """High 32 bits of the 64-bit product of two uint32 arrays."""
  mask = jnp.uint32(0xFFFF)
  shift = jnp.uint32(16)
  a0, a1 = a & mask, a >> shift
  b0, b1 = b & mask, b >> shift
  low_low = a0 * b0
  cross_1 = a1 * b0
  cross_2 = a0 * b1
  carry = ((low_low >> shift) + (cross_1 & mask) + (cross_2 & mask)) >> shift
  return a1 * b1 + (cross_1 >> shift) + (cross_2 >> shift) + carry


def rotation_angles(positions: jnp.ndarray, frequencies: np.ndarray) -> jnp.ndarray:
  """Angles `positions[..., None] * frequencies`, reduced to [-π, π), float32.

  Args:
    positions: integer array, any shape `[...]`, values with |p| < 2^31.
    frequencies: static NumPy array `[F]` of angular frequencies (rad per
      position); any real values.

  Returns:
    float32 array `[..., F]`, equal to the exact angle modulo 2π to ~2e-7 rad.

  Raises:
    TypeError: if `positions` is not an integer array. Fractional positions
      would lose the exactness this function exists for; scale the
      frequencies instead (position interpolation is `ω / s`, not `p / s`).
  """
  positions = jnp.asarray(positions)
  if not jnp.issubdtype(positions.dtype, jnp.integer):
    raise TypeError(
        f'positions must be an integer array, got dtype {positions.dtype}; '
        'to scale positions, scale the frequencies instead.')
  hi, lo = _split_turns(frequencies)
  p = positions.astype(jnp.int32)[..., None]
  p_u32 = jax.lax.bitcast_convert_type(p, jnp.uint32)
  # Fixed-point turns, modulo 1 turn == modulo 2^32 in uint32 arithmetic.
  # A negative p is p + 2^32 as uint32: exact for the `hi` product (it wraps),
  # while the `lo` product's high word gains `lo`, which we take back.
  carry = _mul_hi_u32(p_u32, jnp.asarray(lo))
  carry = carry - jnp.where(p < 0, jnp.asarray(lo), jnp.uint32(0))
  turns_u32 = p_u32 * jnp.asarray(hi) + carry
  # As int32 the fraction lies in [-1/2, 1/2) turns, i.e. [-π, π).
  turns_i32 = jax.lax.bitcast_convert_type(turns_u32, jnp.int32)
  return turns_i32.astype(jnp.float32) * jnp.float32(2.0 * math.pi / _TWO_32)

