"""T5 relative position bias (Raffel et al. 2020).

Each head learns one scalar per *bucket* of the relative distance, added to
the attention scores. Buckets are exact for small distances and logarithmic
up to `max_distance`, beyond which every distance shares the last bucket —
so the bias is defined at any length (the last bucket is simply reused).

Causal (`causal=True`): only keys at or before the query are seen, so all
`num_buckets` buckets go to distances `i - j >= 0`. Bidirectional: half the
buckets for keys before the query, half for keys after it, as in T5.
"""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention.scores import relative_distance
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import dense_spec
from attention_jax.positional.base import heads_rank4
from attention_jax.positional.base import integer_option
from attention_jax.positional.base import not_linear
from attention_jax.positional.parameters import HEADS
from attention_jax.positional.parameters import param


def relative_position_bucket(q_positions, k_positions, *, causal: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> jnp.ndarray:
  """Bucket ids, int32 `[T_q, T_k]` (or `[B, T_q, T_k]`), of `i - j` for integer
  positions `[T_q]`, `[T_k]` (or `[B, ·]`)."""
  if num_buckets < 2 or (not causal and num_buckets < 4):
    raise ValueError(f'num_buckets={num_buckets} is too small (>= 2 causal, >= 4 '
                     'bidirectional).')
  distance = relative_distance(q_positions, k_positions)  # i - j
  offset = jnp.zeros_like(distance)
  if causal:
    distance = jnp.maximum(distance, 0)  # keys after the query are masked anyway
  else:
    num_buckets //= 2
    offset = jnp.where(distance < 0, num_buckets, 0)  # keys after the query
    distance = jnp.abs(distance)
  max_exact = num_buckets // 2
  # Distances >= max_exact: log-spaced buckets up to max_distance, then capped.
  log_ratio = (jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact)
               / np.log(max_distance / max_exact))
  large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, num_buckets - 1)
  return offset + jnp.where(distance < max_exact, distance, large)


class T5RelativeBias(PositionalEncoding):
  """'t5': a learned per-head scalar per relative-distance bucket."""

  def __init__(self, num_heads: int, *, causal: bool = True, num_buckets: int = 32,
               max_distance: int = 128, rngs: nnx.Rngs, stddev: float = 0.02):
    if max_distance <= num_buckets // (2 if causal else 4):
      raise ValueError(f'max_distance={max_distance} must exceed the exact range '
                       f'({num_buckets // (2 if causal else 4)} for num_buckets={num_buckets}).')
    self.causal, self.num_buckets, self.max_distance = causal, num_buckets, max_distance
    self.table = param(nnx.initializers.normal(stddev)(rngs.params(), (num_buckets, num_heads)),
                       (None, HEADS))

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs, num_buckets=32,
            max_distance=128):
    del d_model, max_positions
    num_buckets = integer_option('t5', 'num_buckets', num_buckets, at_least=2 if causal else 4,
                                 why='half of them exact distances, the rest log-spaced')
    max_distance = integer_option('t5', 'max_distance', max_distance, at_least=1)
    return cls(num_heads, causal=causal, num_buckets=num_buckets,
               max_distance=max_distance, rngs=rngs)

  def attention_bias(self, q_positions, k_positions):
    """-> float32 `[1|B, H, T_q, T_k]`: the table at each pair's bucket."""
    buckets = relative_position_bucket(
        q_positions, k_positions, causal=self.causal, num_buckets=self.num_buckets,
        max_distance=self.max_distance)
    bias = jnp.take(self.table[...].astype(jnp.float32), buckets, axis=0)  # [..., Tq, Tk, H]
    return heads_rank4(jnp.moveaxis(bias, -1, -3))  # [1|B, H, Tq, Tk]

  def score_contribution(self, context):
    """`attention_bias` at the call's positions, as a `DenseBias`."""
    return dense_spec(self.attention_bias(context.q_positions, context.k_positions),
                      not_linear(self))
