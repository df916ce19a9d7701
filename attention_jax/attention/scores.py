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
* `WindowBias(lows, highs, q_positions, k_positions, sink)` — a hard window
  per head on position ids (Hard-ALiBi, `windowed_rope` on coupled ids): key
  j is visible to query i in head h when `lows[h] <= p_i - p_j <= highs[h]`
  (or, with `sink`, when `p_j == 0`), MASK_VALUE elsewhere; a head whose
  bounds are None sees every key. Built from O(T) integers.
* `DenseBias(bias, origin)` — any additive bias, float32
  `[B|1, H|1, T_q, T_k]`; `origin` names its source in error messages.
"""

import dataclasses
from typing import Optional, Union

import jax.numpy as jnp
import numpy as np

# Finite and far below any real score, with headroom so that `score - max`
# inside softmax cannot overflow to -inf (the same choice as jax.nn).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


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


def _bound(value, name: str) -> Optional[int]:
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f'WindowBias: {name} must hold integers or None, got {value!r}.')
  return int(value)


@dataclasses.dataclass(frozen=True, eq=False)
class WindowBias:
  """0 where `lows[h] <= p_i - p_j <= highs[h]` (or `sink` and `p_j == 0`),
  MASK_VALUE elsewhere: lows and highs one int or None per head (static;
  None: unbounded on that side, both None: the head sees every key);
  q_positions int `[B|1, T_q]` and k_positions int `[B|1, T_k]`, or None for
  the token indices 0 … T-1."""
  lows: tuple[Optional[int], ...]
  highs: tuple[Optional[int], ...]
  q_positions: Optional[jnp.ndarray] = None
  k_positions: Optional[jnp.ndarray] = None
  sink: bool = False
  origin: str = 'a window bias'

  def __post_init__(self):
    lows = tuple(_bound(x, 'lows') for x in self.lows)
    highs = tuple(_bound(x, 'highs') for x in self.highs)
    if len(lows) != len(highs) or not lows:
      raise ValueError(f'WindowBias takes one low and one high bound per head, got lows='
                       f'{self.lows!r} and highs={self.highs!r} (from {self.origin}).')
    object.__setattr__(self, 'lows', lows)
    object.__setattr__(self, 'highs', highs)
    for name in ('q_positions', 'k_positions'):
      p = getattr(self, name)
      if p is not None:
        p = jnp.asarray(p)
        p = p[None] if p.ndim == 1 else p
        if p.ndim != 2 or not jnp.issubdtype(p.dtype, jnp.integer):
          raise ValueError(f'WindowBias: {name} must be integer [B|1, T] or [T], got '
                           f'{p.dtype} {jnp.shape(p)} (from {self.origin}).')
        object.__setattr__(self, name, p)

  @property
  def num_heads(self) -> int:
    return len(self.lows)

  def positions(self, t_q: int, t_k: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """int32 (q `[B|1, T_q]`, k `[B|1, T_k]`): the ids, or the token indices."""
    q = jnp.arange(t_q)[None] if self.q_positions is None else self.q_positions
    k = jnp.arange(t_k)[None] if self.k_positions is None else self.k_positions
    return q.astype(jnp.int32), k.astype(jnp.int32)

  def dense(self, t_q: int, t_k: int) -> jnp.ndarray:
    """The bias it stands for, float32 `[B|1, H, T_q, T_k]`."""
    q, k = self.positions(t_q, t_k)
    d = relative_distance(q, k)[:, None]  # [B|1, 1, T_q, T_k]
    big = np.iinfo(np.int32).max
    lo = np.array([-big if x is None else x for x in self.lows], np.int64)
    hi = np.array([big if x is None else x for x in self.highs], np.int64)
    inside = (d >= lo[:, None, None]) & (d <= hi[:, None, None])
    if self.sink:
      inside = inside | (k[:, None, None, :] == 0)
    return jnp.where(inside, 0.0, MASK_VALUE).astype(jnp.float32)


@dataclasses.dataclass(frozen=True, eq=False)
class DenseBias:
  """A materialised additive bias, broadcastable to `[B, H, T_q, T_k]`, rank 4."""
  bias: jnp.ndarray
  origin: str = 'a dense bias'

  def __post_init__(self):
    if jnp.ndim(self.bias) != 4:
      raise ValueError(f'DenseBias takes a rank-4 bias [B|1, H|1, T_q, T_k], got shape '
                       f'{jnp.shape(self.bias)} (from {self.origin}).')


ScoreBias = Union[NoBias, LinearBias, DifferenceBias, WindowBias, DenseBias]


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
                difference: Optional[DifferenceBias] = None,
                windows: Optional[WindowBias] = None) -> Optional[jnp.ndarray]:
  """A dense bias (rank 4, or None) plus, if given, the linear bias of
  `slopes` on indices 0 … T_q-1, 0 … T_k-1, a `DifferenceBias` and a
  `WindowBias`: float32 `[B|1, H|1, T_q, T_k]`."""
  grids = []
  if windows is not None:
    grids.append(windows.dense(t_q, t_k))
  if slopes is not None:
    grids.append(linear_bias(slopes, relative_distance(np.arange(t_q), np.arange(t_k)))[None])
  if difference is not None:
    grids.append(difference.dense())
  for grid in grids:
    bias = grid if bias is None else bias.astype(jnp.float32) + grid
  return bias
