"""What an encoding adds to the attention scores, as a small spec, and the
one relative-distance grid every bias and mask is built from.

A positional encoding does not hand attention a T_q × T_k array when a
cheaper description exists: `scaled_dot_product_attention` builds the bias
the way the kernel it picks needs it (the dense kernel materialises it, the
blockwise kernel rebuilds a linear bias block by block from its slopes).

* `NoBias()` — nothing added.
* `LinearBias(slopes)` — `-slope_h · (i - j)` for query index i and key
  index j (ALiBi's causal bias at positions 0 … T-1), slopes `[H]`.
* `DifferenceBias(q_values, k_values)` — `q_values[b, h, i] - k_values[b, h, j]`
  from float32 `[B|1, H, T_q]` and `[B|1, H, T_k]`: a data-dependent linear
  bias (forgetting attention's `c_i - c_j`, c the cumulative log forget gate),
  built block by block from O(T) numbers and differentiable in both.
* `DenseBias(bias, origin)` — any additive bias, float32
  `[B|1, H|1, T_q, T_k]`; `origin` names its source in error messages.
"""

import dataclasses
from typing import Optional, Union

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class NoBias:
  """No contribution to the scores."""


@dataclasses.dataclass(frozen=True)
class LinearBias:
  """`-slopes[h] · (i - j)` on token indices; slopes: a tuple of floats `[H]`
  (static: constants of the graph, no gradient)."""
  slopes: tuple[float, ...]

  def __post_init__(self):
    object.__setattr__(self, 'slopes', tuple(float(s) for s in np.ravel(self.slopes)))


@dataclasses.dataclass(frozen=True, eq=False)
class DifferenceBias:
  """`q_values[b, h, i] - k_values[b, h, j]`: q_values `[B|1, H, T_q]`,
  k_values `[B|1, H, T_k]` (cast to float32; gradients flow to both)."""
  q_values: jnp.ndarray
  k_values: jnp.ndarray
  origin: str = 'a difference bias'

  def __post_init__(self):
    q, k = jnp.shape(self.q_values), jnp.shape(self.k_values)
    if (len(q) != 3 or len(k) != 3 or q[1] != k[1]
        or (q[0] != k[0] and 1 not in (q[0], k[0]))):
      raise ValueError(f'DifferenceBias takes q_values [B|1, H, T_q] and k_values '
                       f'[B|1, H, T_k] with the same H, got {q} and {k} (from {self.origin}).')

  def dense(self) -> jnp.ndarray:
    """The bias it stands for, float32 `[B|1, H, T_q, T_k]`."""
    q = jnp.asarray(self.q_values, jnp.float32)
    k = jnp.asarray(self.k_values, jnp.float32)
    return q[..., :, None] - k[..., None, :]


@dataclasses.dataclass(frozen=True, eq=False)
class DenseBias:
  """A materialised additive bias, broadcastable to `[B, H, T_q, T_k]`, rank 4."""
  bias: jnp.ndarray
  origin: str = 'a dense bias'

  def __post_init__(self):
    if jnp.ndim(self.bias) != 4:
      raise ValueError(f'DenseBias takes a rank-4 bias [B|1, H|1, T_q, T_k], got shape '
                       f'{jnp.shape(self.bias)} (from {self.origin}).')


ScoreBias = Union[NoBias, LinearBias, DifferenceBias, DenseBias]


def relative_distance(q_positions, k_positions) -> jnp.ndarray:
  """`i - j` for integer positions `[..., T_q]` and `[..., T_k]` -> int32
  `[..., T_q, T_k]` (leading axes broadcast)."""
  q = jnp.asarray(q_positions)
  k = jnp.asarray(k_positions)
  return (q[..., :, None] - k[..., None, :]).astype(jnp.int32)


def linear_bias(slopes, distance) -> jnp.ndarray:
  """`-slope_h · distance`: slopes `[H]` (or `[G]`), distance `[..., T_q, T_k]`
  -> float32 `[..., H, T_q, T_k]`. The one place ALiBi's bias is computed."""
  slopes = jnp.asarray(slopes, jnp.float32)[:, None, None]
  return -slopes * jnp.asarray(distance)[..., None, :, :].astype(jnp.float32)


def is_arange(positions) -> bool:
  """True for static positions 0 … T-1 (a NumPy `[T]`), the only positions a
  `LinearBias` (defined on token indices) may stand for."""
  return (isinstance(positions, np.ndarray) and positions.ndim == 1
          and np.array_equal(positions, np.arange(len(positions))))


def materialise(bias: Optional[jnp.ndarray], slopes: Optional[tuple[float, ...]],
                t_q: int, t_k: int,
                difference: Optional[DifferenceBias] = None) -> Optional[jnp.ndarray]:
  """A dense bias (rank 4, or None) plus, if given, the linear bias of
  `slopes` on indices 0 … T_q-1, 0 … T_k-1 and a `DifferenceBias`: float32
  `[B|1, H|1, T_q, T_k]`."""
  grids = []
  if slopes is not None:
    grids.append(linear_bias(slopes, relative_distance(np.arange(t_q), np.arange(t_k)))[None])
  if difference is not None:
    grids.append(difference.dense())
  for grid in grids:
    bias = grid if bias is None else bias.astype(jnp.float32) + grid
  return bias
