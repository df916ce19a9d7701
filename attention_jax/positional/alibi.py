"""ALiBi, attention with linear biases (Press et al. 2022).

Head h adds `-slope_h * (i - j)` to the score of query i for key j. No
embedding is added and nothing is rotated.

Slopes follow the authors' reference code: for n heads, a power of two,
slope_k = 2^(-8k/n), k = 1 … n. Otherwise, with m the largest power of two
below n, the m slopes of m heads come first, followed by the odd-indexed
slopes of 2m heads (every other one, starting with the first) up to n. For 12
heads: 1/2, 1/4, …, 1/256, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.

Causal (`causal=True`): bias `-slope * (i - j)`, meant for keys j <= i (the
causal mask hides the rest). Bidirectional (`causal=False`): the symmetric
variant `-slope * |i - j|`, which penalises distance in both directions alike;
with `left_offset` (Ruoss et al. 2023's encoder, google-deepmind/
randomized_positional_encodings `compute_alibi_encodings_biases`: 0.5),
`slope * left_offset` is added for keys left of the query (j < i), so that
the model can tell left from right. Given `ScoreContext.distances` (their
randomized ALiBi samples distances), the bias reads them instead of i - j.

In a model, the causal bias at positions 0 … T-1 is handed to attention as a
`LinearBias` (its slopes): the blockwise kernel rebuilds it block by block and
the dense one materialises it with `attention.scores.linear_bias`, the helper
every ALiBi bias here is built with. Other positions, or the symmetric bias,
are a `DenseBias`: O(T_q T_k) memory and work per head.
"""

import math

import jax.numpy as jnp
import numpy as np

from attention_jax.attention.scores import DenseBias
from attention_jax.attention.scores import LinearBias
from attention_jax.attention.scores import is_arange
from attention_jax.attention.scores import linear_bias
from attention_jax.attention.scores import relative_distance
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import ScoreContext
from attention_jax.positional.base import heads_rank4
from attention_jax.positional.base import real_option


def _power_of_two_slopes(n: int) -> list[float]:
  return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]


def alibi_slopes(num_heads: int) -> np.ndarray:
  """Per-head slopes, float32 `[num_heads]`, in the reference order."""
  if num_heads < 1:
    raise ValueError(f'num_heads must be >= 1, got {num_heads}.')
  m = 2 ** math.floor(math.log2(num_heads))
  slopes = _power_of_two_slopes(m)
  if m < num_heads:
    slopes += _power_of_two_slopes(2 * m)[0::2][: num_heads - m]
  return np.asarray(slopes, np.float32)


def alibi_bias_at(slopes: jnp.ndarray, q_positions: jnp.ndarray,
                  k_positions: jnp.ndarray, causal: bool = True,
                  left_offset: float = 0.0, distance=None) -> jnp.ndarray:
  """Bias from integer positions `[T_q]`, `[T_k]` (or `[B, T_q]`, `[B, T_k]`),
  or from signed `distance` `[(B,) T_q, T_k]` when given, -> float32
  `[H, T_q, T_k]` (or `[B, H, T_q, T_k]`)."""
  if distance is None:
    distance = relative_distance(q_positions, k_positions)
  if causal:
    return linear_bias(slopes, distance)
  return linear_bias(slopes, jnp.abs(distance) - left_offset * (distance > 0))


def alibi_bias(num_heads: int, q_len: int, k_len: int,
               causal: bool = True) -> jnp.ndarray:
  """Bias for positions 0 … q_len-1 and 0 … k_len-1: float32 `[num_heads, q_len, k_len]`."""
  return alibi_bias_at(alibi_slopes(num_heads), np.arange(q_len), np.arange(k_len),
                       causal)


class ALiBi(PositionalEncoding):
  """'alibi': adds a per-head linear distance penalty to the scores."""

  reads_distances = True

  def __init__(self, num_heads: int, causal: bool = True, left_offset: float = 0.0):
    # Static Python floats: constants of the graph, not parameters.
    self.slopes = tuple(float(s) for s in alibi_slopes(num_heads))
    self.causal = causal
    self.left_offset = real_option('alibi', 'left_offset', left_offset, at_least=0.0)
    if causal and self.left_offset:
      raise ValueError(f'alibi: left_offset={left_offset!r} tells left from right in '
                       'bidirectional attention (causal=False); a causal model sees '
                       'only the left: leave it 0.')

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs, left_offset=0.0):
    del d_model, max_positions, rngs
    return cls(num_heads, causal, left_offset)

  def attention_bias(self, q_positions, k_positions, distance=None):
    """-> float32 `[1|B, H, T_q, T_k]`."""
    return heads_rank4(alibi_bias_at(self.slopes, q_positions, k_positions, self.causal,
                                     self.left_offset, distance))

  def score_contribution(self, context: ScoreContext):
    """`LinearBias(slopes)` for the causal bias at positions 0 … T-1 (linear
    in the token indices i - j), else the materialised `DenseBias`."""
    q_positions, k_positions = context.q_positions, context.k_positions
    if (self.causal and context.distances is None and is_arange(q_positions)
        and is_arange(k_positions)):
      return LinearBias(self.slopes)
    why = ('bidirectional, -slope·|i - j|, which is not linear in i - j' if not self.causal
           else 'at positions other than the default 0 … T-1 (a linear bias is built '
           'from token indices)')
    return DenseBias(self.attention_bias(q_positions, k_positions, context.distances),
                     origin=f'the bias of ALiBi ({why})')
