"""What an encoding adds to the attention scores, as small specs, and the
one relative-distance grid every bias and mask is built from.

A positional encoding does not hand attention a T_q × T_k array when a
cheaper description exists: `scaled_dot_product_attention` passes the
call's specs whole to the kernel it picks (`dispatch.py`), and each kernel
builds the kinds it declares (`Kernel.accepts`) its own way: the dense
kernel materialises them, the blockwise kernel rebuilds a linear bias block
by block from its slopes.

Every kind is a `ScoreSpec` subclass and says, itself, all that the
dispatcher needs: `kind` (how refusals name it), `compact` (described by
O(T) numbers, so 'auto' prefers a kernel that builds it without a
T_q × T_k array), `check` (does it fit the call's B, H, T_q, T_k),
`broadcasts` (size 1 along T_q or T_k) and `dense` (the array it stands
for: the kernels that materialise take every kind that has one). Its array fields have the
batch as their leading axis (size B or 1): running a kernel per device
(`partition.py`) splits them there. A new kind is one subclass here (or in
a user's own code) and the kernels that take it; nothing else changes.

* `NoBias()` — nothing added.
* `LinearBias(slopes)` — `-slope_h · (i - j)` for query index i and key
  index j (ALiBi's causal bias at positions 0 … T-1), slopes `[H]`.
* `DifferenceBias(q_values, k_values)` — `q_values[b, i, h] - k_values[b, j, h]`
  from float32 `[B|1, T_q, H]` and `[B|1, T_k, H]` (per-token arrays in
  Flax's order, [batch, length, heads]): a data-dependent linear bias
  (forgetting attention's `c_i - c_j`, c the cumulative log forget gate),
  built block by block from O(T) numbers and differentiable in both.
* `WindowBias(lows, highs, q_positions, k_positions, sink)` — a hard window
  per head on position ids (Hard-ALiBi, `windowed_rope` on coupled ids): key
  j is visible to query i in head h when `lows[h] <= p_i - p_j <= highs[h]`
  (or, with `sink`, when `p_j == 0`), MASK_VALUE elsewhere; a head whose
  bounds are None sees every key. Built from O(T) integers.
* `DenseBias(bias, origin)` — any additive bias, `[B|1, H|1, T_q, T_k]`
  (float32, or the caller's float dtype for the `bias=` argument).

Each spec's `origin` names its source in error messages.
"""

import dataclasses
from typing import ClassVar, Optional

import jax.numpy as jnp
import numpy as np

from attention_jax.attention.checks import check_array
from attention_jax.attention.checks import check_flag

# Finite and far below any real score, with headroom so that `score - max`
# inside softmax cannot overflow to -inf (the same choice as jax.nn).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def _source(origin: Optional[str]) -> str:
  return f' (from {origin})' if origin else ''


class ScoreSpec:
  """The base of every kind of score spec (module docstring). A kind is a
  frozen dataclass subclass with an `origin: Optional[str] = None` field;
  it sets `kind` and `compact` and overrides what differs from these
  defaults. A kernel takes the kinds its `Kernel.accepts` names, and their
  subclasses."""

  kind: ClassVar[str] = 'a score spec'  # how refusals name it
  compact: ClassVar[bool] = True  # O(T) numbers: a kernel may build it block by block
  origin: Optional[str] = None

  def check(self, b: int, h: int, t_q: int, t_k: int) -> None:
    """A ValueError naming the shapes if the spec cannot serve a call of
    batch B, H query heads and lengths T_q, T_k; nothing by default."""
    del b, h, t_q, t_k

  def broadcasts(self, t_q: int, t_k: int) -> bool:
    """Whether it is of size 1 along T_q or T_k (some kernels take only the
    full grid); False by default."""
    del t_q, t_k
    return False

  def dense(self, t_q: int, t_k: int) -> jnp.ndarray:
    """The bias it stands for, float32 `[B|1, H|1, T_q, T_k]`."""
    raise NotImplementedError(f'{type(self).__name__} has no dense form: give it a '
                              '`dense(t_q, t_k)` for the materialising kernels.')


# The type of one spec (the name `scaled_dot_product_attention` documents).
ScoreBias = ScoreSpec


@dataclasses.dataclass(frozen=True)
class NoBias(ScoreSpec):
  """No contribution to the scores (dropped before any kernel sees it)."""
  kind: ClassVar[str] = 'no bias'


@dataclasses.dataclass(frozen=True)
class LinearBias(ScoreSpec):
  """`-slopes[h] · (i - j)` on token indices; slopes: a tuple of floats `[H]`
  (static: constants of the graph, no gradient)."""
  kind: ClassVar[str] = 'a linear bias (ALiBi slopes)'
  slopes: tuple[float, ...]
  origin: Optional[str] = None

  def __post_init__(self):
    slopes = self.slopes
    if isinstance(slopes, str) or np.ndim(slopes) != 1:
      raise ValueError(f'LinearBias: slopes={slopes!r} must be a sequence of one float per '
                       f'head [H]{_source(self.origin)}.')
    try:
      slopes = tuple(float(s) for s in slopes)
    except (TypeError, ValueError):
      raise TypeError(f'LinearBias: slopes={self.slopes!r} must hold numbers'
                      f'{_source(self.origin)}.') from None
    if not all(np.isfinite(slopes)):
      raise ValueError(f'LinearBias: slopes={slopes!r} must be finite{_source(self.origin)}.')
    object.__setattr__(self, 'slopes', slopes)

  def check(self, b, h, t_q, t_k):
    del b, t_q, t_k
    if len(self.slopes) != h:
      raise ValueError(f'a LinearBias of {len(self.slopes)} slopes for {h} heads'
                       f'{_source(self.origin)}.')

  def dense(self, t_q, t_k):
    return linear_bias(self.slopes, relative_distance(np.arange(t_q), np.arange(t_k)))[None]


@dataclasses.dataclass(frozen=True, eq=False)
class DifferenceBias(ScoreSpec):
  """`q_values[b, i, h] - k_values[b, j, h]`: q_values `[B|1, T_q, H]`,
  k_values `[B|1, T_k, H]` (cast to float32; gradients flow to both)."""
  kind: ClassVar[str] = "a difference bias (forgetting attention's gates)"
  q_values: jnp.ndarray
  k_values: jnp.ndarray
  origin: Optional[str] = None

  def __post_init__(self):
    for name in ('q_values', 'k_values'):
      check_array(name, getattr(self, name), kind='floating')
    q, k = jnp.shape(self.q_values), jnp.shape(self.k_values)
    if (len(q) != 3 or len(k) != 3 or q[2] != k[2]
        or (q[0] != k[0] and 1 not in (q[0], k[0]))):
      raise ValueError(f'DifferenceBias takes q_values [B|1, T_q, H] and k_values '
                       f'[B|1, T_k, H] with the same H, got {q} and {k}'
                       f'{_source(self.origin)}.')

  def check(self, b, h, t_q, t_k):
    q, k = jnp.shape(self.q_values), jnp.shape(self.k_values)
    if q[0] not in (1, b) or k[0] not in (1, b) or q[2] != h or q[1] != t_q or k[1] != t_k:
      raise ValueError(f'a DifferenceBias of q_values {q} and k_values {k}'
                       f'{_source(self.origin)} for B={b}, H={h}, T_q={t_q}, T_k={t_k}: '
                       'need [B|1, T_q, H] and [B|1, T_k, H].')

  def heads_first(self) -> tuple[jnp.ndarray, jnp.ndarray]:
    """float32 (q_values `[B|1, H, T_q]`, k_values `[B|1, H, T_k]`): one row
    per (example, head), the layout the kernels walk."""
    return tuple(jnp.moveaxis(jnp.asarray(x, jnp.float32), -1, 1)
                 for x in (self.q_values, self.k_values))

  def dense(self, t_q=None, t_k=None):
    del t_q, t_k  # the values' own lengths
    q, k = self.heads_first()
    return q[..., :, None] - k[..., None, :]


def _bound(value, name: str) -> Optional[int]:
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f'WindowBias: {name} must hold integers or None, got {value!r}.')
  return int(value)


@dataclasses.dataclass(frozen=True, eq=False)
class WindowBias(ScoreSpec):
  """0 where `lows[h] <= p_i - p_j <= highs[h]` (or `sink` and `p_j == 0`),
  MASK_VALUE elsewhere: lows and highs one int or None per head (static;
  None: unbounded on that side, both None: the head sees every key);
  q_positions int `[B|1, T_q]` and k_positions int `[B|1, T_k]`, or None for
  the token indices 0 … T-1."""
  kind: ClassVar[str] = 'a window bias (per-head windows on position ids)'
  lows: tuple[Optional[int], ...]
  highs: tuple[Optional[int], ...]
  q_positions: Optional[jnp.ndarray] = None
  k_positions: Optional[jnp.ndarray] = None
  sink: bool = False
  origin: Optional[str] = None

  def __post_init__(self):
    lows = tuple(_bound(x, 'lows') for x in self.lows)
    highs = tuple(_bound(x, 'highs') for x in self.highs)
    if len(lows) != len(highs) or not lows:
      raise ValueError(f'WindowBias takes one low and one high bound per head, got lows='
                       f'{self.lows!r} and highs={self.highs!r}{_source(self.origin)}.')
    object.__setattr__(self, 'lows', lows)
    object.__setattr__(self, 'highs', highs)
    check_flag('WindowBias', 'sink', self.sink)
    for name in ('q_positions', 'k_positions'):
      p = getattr(self, name)
      if p is not None:
        p = check_array(name, p)
        p = p[None] if p.ndim == 1 else p
        if p.ndim != 2 or not jnp.issubdtype(p.dtype, jnp.integer):
          raise ValueError(f'WindowBias: {name} must be integer [B|1, T] or [T], got '
                           f'{p.dtype} {jnp.shape(p)}{_source(self.origin)}.')
        object.__setattr__(self, name, p)

  @property
  def num_heads(self) -> int:
    return len(self.lows)

  def positions(self, t_q: int, t_k: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """int32 (q `[B|1, T_q]`, k `[B|1, T_k]`): the ids, or the token indices."""
    q = jnp.arange(t_q)[None] if self.q_positions is None else self.q_positions
    k = jnp.arange(t_k)[None] if self.k_positions is None else self.k_positions
    return q.astype(jnp.int32), k.astype(jnp.int32)

  def check(self, b, h, t_q, t_k):
    q, k = self.positions(t_q, t_k)
    if (self.num_heads != h or q.shape[0] not in (1, b) or k.shape[0] not in (1, b)
        or q.shape[1] != t_q or k.shape[1] != t_k):
      raise ValueError(f'a WindowBias of {self.num_heads} heads and positions {q.shape}, '
                       f'{k.shape}{_source(self.origin)} for B={b}, H={h}, T_q={t_q}, '
                       f'T_k={t_k}: need one window per head and [B|1, T_q], [B|1, T_k].')

  def dense(self, t_q, t_k):
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
class DenseBias(ScoreSpec):
  """A materialised additive bias, broadcastable to `[B, H, T_q, T_k]`, rank 4."""
  kind: ClassVar[str] = 'a dense bias'
  compact: ClassVar[bool] = False  # already T_q × T_k: nothing to save by building it
  bias: jnp.ndarray
  origin: Optional[str] = None

  def __post_init__(self):
    check_array('bias', self.bias, kind='floating')
    if jnp.ndim(self.bias) != 4:
      raise ValueError(f'DenseBias takes a rank-4 bias [B|1, H|1, T_q, T_k], got shape '
                       f'{jnp.shape(self.bias)}{_source(self.origin)}.')

  def broadcasts(self, t_q, t_k):
    return tuple(jnp.shape(self.bias)[-2:]) != (t_q, t_k)

  def dense(self, t_q=None, t_k=None):
    """The bias in float32, or in its own dtype where that is wider."""
    del t_q, t_k
    bias = jnp.asarray(self.bias)
    return bias.astype(jnp.promote_types(bias.dtype, jnp.float32))


def describe(spec) -> str:
  """How a refusal names a spec, or a spec class: its kind, and its origin."""
  origin = None if isinstance(spec, type) else spec.origin
  return spec.kind if not origin else f'{spec.kind} from {origin}'


def as_terms(score_bias) -> tuple[ScoreSpec, ...]:
  """A call's `score_bias=` as a tuple of specs: None or `NoBias()` -> (),
  one spec -> (spec,), a tuple or list of specs (added) -> those, less any
  `NoBias()`. Anything else: a TypeError naming it."""
  items = score_bias if isinstance(score_bias, (tuple, list)) else (score_bias,)
  terms = []
  for item in items:
    if item is None or isinstance(item, NoBias):
      continue
    if not isinstance(item, ScoreSpec):
      raise TypeError('score_bias must be a ScoreSpec (NoBias, LinearBias, DifferenceBias, '
                      'WindowBias, DenseBias or a kind of your own), a tuple of them or '
                      f'None, got {type(item).__name__}.')
    terms.append(item)
  return tuple(terms)


def one_of_each(scores, kinds, kernel: str) -> tuple:
  """For a kernel that builds each kind its own way: the term of each class
  in `kinds`, in that order (None where absent). A ValueError naming the
  kernel for a term of another kind or a second term of one kind (the
  dispatcher sends neither)."""
  found = dict.fromkeys(kinds)
  for term in scores:
    kind = next((k for k in kinds if isinstance(term, k)), None)
    if kind is None or found[kind] is not None:
      raise ValueError(f'{kernel} takes at most one each of '
                       f'{", ".join(k.__name__ for k in kinds) or "no score spec"}, got '
                       f'{", ".join(type(t).__name__ for t in scores)}.')
    found[kind] = term
  return tuple(found.values())


def relative_distance(q_positions, k_positions) -> jnp.ndarray:
  """`i - j` for integer positions `[..., T_q]` and `[..., T_k]` -> int32
  `[..., T_q, T_k]` (leading axes broadcast)."""
  q = check_array('q_positions', q_positions, kind='integer')
  k = check_array('k_positions', k_positions, kind='integer')
  if q.ndim < 1 or k.ndim < 1:
    raise ValueError(f'q_positions and k_positions must have a length axis [..., T], got '
                     f'shapes {tuple(q.shape)} and {tuple(k.shape)}.')
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


def materialise(scores, t_q: int, t_k: int) -> Optional[jnp.ndarray]:
  """The sum of the specs' dense forms, in their order, float32 (or wider)
  `[B|1, H|1, T_q, T_k]`; None for no spec."""
  bias = None
  for term in scores:
    grid = term.dense(t_q, t_k)
    bias = grid if bias is None else bias.astype(jnp.float32) + grid
  return bias
