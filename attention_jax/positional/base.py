"""The interface every positional encoding implements: optional hooks.

An encoding contributes to a transformer in at most these places, so the
attention code never needs to ask which encoding it is:

* `add_to_embeddings` — absolute encodings (sinusoidal, learned) add a vector
  to each token embedding before the first block (`TransformerLM` calls it;
  attention modules refuse an encoding that has only this hook);
* `rotate_queries_keys` — RoPE rotates q and k inside every attention layer;
* `score_contribution(context)` — the one score hook: what the encoding adds
  to the scores of one attention call, as a score spec (`attention.scores`:
  `LinearBias`, `DifferenceBias`, `WindowBias`, `DenseBias`, a `ScoreSpec`
  kind of one's own, or a tuple of them; `NoBias()` for nothing), so that
  each attention kernel builds it its own way. A `ScoreContext` holds the
  call's positions, its rotated q and k (CoPE gates on q·k), the encoding's
  own per-token features of the layer input (`token_features`, e.g.
  forgetting attention's log forget gates) and the call's structure.
  Relative encodings (ALiBi, T5, KERPLE) read only the positions;
  `dense_spec` wraps a dense bias array as a `DenseBias`.
* `token_features(x)` — per-token numbers computed from a layer's input
  `[B, T, d_model]` -> float32 `[B, T, F]`, or None. Modules compute them
  for queries and keys, and a key/value cache stores the keys' features next
  to the keys, so cached decoding sees what the full pass sees.

Encodings whose bias depends on positions only also have a method
`attention_bias(q_positions, k_positions)`, that dense bias itself, for tests
and plots; attention never calls it (a subclass that defines it, or the old
`score_bias`, without `score_contribution` is refused when it is defined).

Precision, as Flax's layers: an encoding's parameters are stored in the
`param_dtype` of `make_encoding` (float32 by default; `positional.parameters`
makes them, with their logical axis names for sharding). What it adds to the
activations (learned and Abacus rows) is in its `dtype` (None: the
activations' own); RoPE-like rotations return q and k in their dtype, with
float32 angles. What it adds to the scores is float32 whatever either dtype:
the scores and the softmax they feed are float32, so its parameters are
promoted to float32 there (FoX's gates, CoPE's counts, FIRE's and DAPE's
MLPs, KERPLE's, T5's, MTA's).

Positions are integer arrays `[T]` (shared by the batch) or `[B, T]`. Modules
default them to `np.arange(T)`: a static array, so length checks happen at
trace time even under `jax.jit`, and linear biases can be recognised.
"""

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention.scores import DenseBias
from attention_jax.attention.scores import NoBias
from attention_jax.attention.scores import ScoreSpec
from attention_jax.attention.scores import relative_distance
from attention_jax.attention.segments import segment_mask


def haiku_truncated_normal(stddev: Optional[float] = None):
  """Haiku's `TruncatedNormal`, for ports of Haiku models: stddev × a normal
  truncated to [-2, 2], not rescaled for the truncation (Flax's and JAX's
  are); stddev None: 1/√fan_in, Haiku's `Linear` default."""
  def init(key, shape, dtype=jnp.float32):
    scale = stddev if stddev is not None else 1.0 / np.sqrt(int(np.prod(shape[:-1])))
    return (scale * jax.random.truncated_normal(key, -2.0, 2.0, shape)).astype(dtype)
  return init


def real_option(encoding: str, name: str, value, *, above=None, at_least=None,
                why: str = '') -> float:
  """`value` as a float if it is a finite real number (not a bool) `> above`
  / `>= at_least`; else a ValueError naming the encoding, the option, the
  value and what is allowed (`why` says what the bound protects). Every
  encoding's `build` checks its options with these, so the library and the
  lab's config checks give one message."""
  ok = (not isinstance(value, (bool, np.bool_))
        and isinstance(value, (int, float, np.integer, np.floating)) and np.isfinite(value)
        and (above is None or value > above) and (at_least is None or value >= at_least))
  if not ok:
    bound = (f' > {above:g}' if above is not None else '') + (
        f' >= {at_least:g}' if at_least is not None else '')
    raise ValueError(f'{encoding}: {name}={value!r} must be a finite number{bound}'
                     + (f' ({why})' if why else '') + '.')
  return float(value)


def integer_option(encoding: str, name: str, value, *, at_least=None, why: str = '') -> int:
  """`value` as an int if it is an integer (not a bool) `>= at_least`; else
  a ValueError as `real_option`'s."""
  if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
      or (at_least is not None and value < at_least)):
    bound = f' >= {at_least}' if at_least is not None else ''
    raise ValueError(f'{encoding}: {name}={value!r} must be an integer{bound}'
                     + (f' ({why})' if why else '') + '.')
  return int(value)


def flag_option(encoding: str, name: str, value) -> bool:
  """`value` if it is True or False; else a ValueError naming it."""
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f'{encoding}: {name}={value!r} must be True or False.')
  return bool(value)


@dataclasses.dataclass(frozen=True, eq=False)
class ScoreContext:
  """What one attention call offers an encoding's `score_contribution`.

  Per-token arrays are in Flax's order, [batch, length, heads, ...].

  q: queries `[B, T_q, H, D]`, after `rotate_queries_keys`.
  k: keys `[B, T_k, H_kv, D]`, after it (the whole cache when decoding).
  q_positions, k_positions: integer `[T]` or `[B, T]`.
  q_slots: int `[T_q]`, each query's index among the keys (0 … T-1 in a
    full self-attention pass, the slots written when decoding over a cache);
    None for cross-attention, where queries are not keys.
  q_features, k_features: `token_features` of the queries' and the keys'
    layer inputs, float32 `[B, T, F]`, or None.
  causal: whether key j is hidden from the query at slot i when j > i.
  window: the module's sliding window (|i - j| < window on indices) or None.
  kv_lengths: int `[B]` (keys at index >= kv_lengths[b] are padding) or None.
  mask: the caller's boolean mask, rank 4 `[B|1, H|1, T_q, T_k]`, or None.
  q_history: for an encoding with `reads_query_history`, the queries of every
    slot 0 … T_k-1 `[B, T_k, H, D]` (slot-aligned with k): q itself in a full
    self-attention pass, the cache's stored queries when decoding; else None.
  distances: None, or int `[T_q, T_k]` (or `[B, T_q, T_k]`): the signed
    query-minus-key distances to use instead of `q_positions - k_positions`,
    for an encoding with `reads_distances` (Ruoss et al. 2023's randomized
    relative encodings sample distances, which no positions produce).
  q_segment_ids, k_segment_ids: int32 `[B, T_q]` and `[B, T_k]`, the
    documents of a packed row (`attention.segments`): a query sees only the
    keys of its own; None without. `visible()` includes them, so an
    encoding that reads the mask (CoPE's counts, DAPE) sees each document
    alone.
  """
  q: jnp.ndarray
  k: jnp.ndarray
  q_positions: jnp.ndarray
  k_positions: jnp.ndarray
  q_slots: Optional[jnp.ndarray] = None
  q_features: Optional[jnp.ndarray] = None
  k_features: Optional[jnp.ndarray] = None
  causal: bool = True
  window: Optional[int] = None
  kv_lengths: Optional[jnp.ndarray] = None
  mask: Optional[jnp.ndarray] = None
  q_history: Optional[jnp.ndarray] = None
  distances: Optional[jnp.ndarray] = None
  q_segment_ids: Optional[jnp.ndarray] = None
  k_segment_ids: Optional[jnp.ndarray] = None

  def distance(self) -> jnp.ndarray:
    """int32 `[..., T_q, T_k]`: `distances` if given, else q - k positions."""
    if self.distances is not None:
      return jnp.asarray(self.distances, jnp.int32)
    return relative_distance(self.q_positions, self.k_positions)

  def visible(self) -> jnp.ndarray:
    """bool `[B|1, H|1, T_q, T_k]`: the keys each query may attend to, as the
    attention call will mask them (causal on slots, window, padding, mask,
    segment ids)."""
    t_q, t_k = self.q.shape[1], self.k.shape[1]
    slots = np.arange(t_q) if self.q_slots is None else self.q_slots
    keys = jnp.arange(t_k)[None, :]
    slots = jnp.asarray(slots, jnp.int32)[:, None]
    keep = jnp.ones((t_q, t_k), bool)
    if self.causal:
      keep = keep & (keys <= slots)
    if self.window is not None:
      keep = keep & (jnp.abs(slots - keys) < self.window)
    keep = keep[None, None]
    if self.kv_lengths is not None:
      keep = keep & (keys < jnp.asarray(self.kv_lengths)[:, None])[:, None, None, :]
    if self.mask is not None:
      keep = keep & self.mask
    if self.q_segment_ids is not None:
      keep = keep & segment_mask(self.q_segment_ids, self.k_segment_ids)
    return keep


def heads_rank4(bias: jnp.ndarray) -> jnp.ndarray:
  """A per-head bias `[H, T_q, T_k]` (positions `[T]`) or `[B, H, T_q, T_k]`
  (positions `[B, T]`) -> rank 4 `[1|B, H, T_q, T_k]`."""
  return bias[None] if bias.ndim == 3 else bias


def dense_spec(bias: Optional[jnp.ndarray], origin: str) -> ScoreSpec:
  """A dense bias `[H, T_q, T_k]` (positions `[T]`) or `[1|B, H, T_q, T_k]`
  as a float32 `DenseBias` named `origin`; `NoBias()` for None."""
  if bias is None:
    return NoBias()
  return DenseBias(heads_rank4(jnp.asarray(bias, jnp.float32)), origin=origin)


def not_linear(encoding) -> str:
  """The origin of a dense bias that no compact spec describes."""
  return f'the bias of {type(encoding).__name__}, which is not linear in i - j'


def torch_linear_init(key, fan_in: int, shape) -> jnp.ndarray:
  """PyTorch's `nn.Linear` default (weights and biases alike): uniform in
  ±1/√fan_in, so a port of a PyTorch
  model (FIRE's and DAPE's MLPs) starts where the official code's does."""
  bound = 1.0 / math.sqrt(fan_in)
  return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


class PositionalEncoding(nnx.Module):
  """Base class; each hook defaults to "no contribution". Also 'none' (NoPE).

  A subclass registered by name (`register_encoding`) also has a `build`
  classmethod taking `d_model, num_heads, max_positions, causal, rngs` and its
  own keyword options.
  """

  # Whether a model gives each layer its own instance (own parameters) by
  # default, as the official code of forgetting attention, CoPE and FIRE
  # does; False: one instance shared by every layer.
  per_layer = False
  # Whether `score_contribution` honours `ScoreContext.distances` (ALiBi,
  # Transformer-XL relative); attention refuses distances for the others.
  reads_distances = False
  # Whether `score_contribution` reads earlier queries (`ScoreContext.q_history`;
  # Multi-Token Attention): self-attention passes them, a cache keeps them.
  reads_query_history = False

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

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    stale = [h for h in ('attention_bias', 'score_bias') if hasattr(cls, h)]
    if stale and cls.score_contribution is PositionalEncoding.score_contribution:
      raise TypeError(
          f'{cls.__name__} defines {" and ".join(stale)}, which attention does not call: '
          'the one score hook is score_contribution(context) -> a score spec, e.g. '
          'dense_spec(self.attention_bias(context.q_positions, context.k_positions), '
          'origin=...) (positional.base).')

  def token_features(self, x: jnp.ndarray) -> Optional[jnp.ndarray]:
    """x `[B, T, d_model]` (a layer's input) -> float32 `[B, T, F]`, or None:
    per-token numbers `score_contribution` reads as `q_features` and
    `k_features` (and a key/value cache keeps for the keys)."""
    del x
    return None

  def score_contribution(self, context: ScoreContext) -> ScoreSpec:
    """What this encoding adds to the scores of one attention call, as a
    score spec or a tuple of them (module docstring); `NoBias()` by default."""
    del context
    return NoBias()

  def check_position_range(self, lo: int, hi: int, dtype=jnp.float32) -> None:
    """A ValueError naming the limit if this encoding cannot serve positions
    `lo … hi` in `dtype` (a table too short, scales past the dtype's range);
    nothing by default (no limit). For a caller that knows its longest
    positions before anything is traced or trained, such as the lab's
    config checks, so that a limit fails first, not after training."""
    del lo, hi, dtype

  @property
  def acts_in_attention(self) -> bool:
    """Whether it rotates q/k or adds to the scores inside attention."""
    return bool(hooks_of(type(self)) & ATTENTION_HOOKS)


HOOKS = ('add_to_embeddings', 'rotate_queries_keys', 'score_contribution', 'token_features')
ATTENTION_HOOKS = frozenset(HOOKS[1:])


def hooks_of(cls: type) -> frozenset:
  """The hooks an encoding class implements (overrides), by name."""
  return frozenset(h for h in HOOKS
                   if getattr(cls, h) is not getattr(PositionalEncoding, h))


def embedding_only(cls: type) -> bool:
  """Whether an encoding class only adds to the embeddings (sinusoidal,
  learned): attention modules refuse it, models add it to the embeddings."""
  hooks = hooks_of(cls)
  return 'add_to_embeddings' in hooks and not hooks & ATTENTION_HOOKS


class NoPE(PositionalEncoding):
  """'none': no positional information at all (a causal mask still breaks
  permutation symmetry; Kazemnejad et al. 2023 find it extrapolates well)."""

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs):
    del d_model, num_heads, max_positions, causal, rngs
    return cls()
