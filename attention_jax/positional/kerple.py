"""KERPLE, kernelized relative positional embedding (Chi et al. 2022), log variant.

Head h adds `-r1_h · log(1 + r2_h · |i - j|)` to the scores, with r1, r2 > 0
learned: a conditionally positive definite kernel of the distance that, like
ALiBi, decays with distance and is defined at every length, but logarithmic
and with its shape learned. r1 = r2 = softplus(raw) keeps both positive; they
start at 1 (the paper initialises its parameters to O(1) values too).
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention.scores import relative_distance
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import dense_spec
from attention_jax.positional.base import heads_rank4
from attention_jax.positional.base import not_linear
from attention_jax.positional.parameters import HEADS
from attention_jax.positional.parameters import param

_SOFTPLUS_INVERSE_OF_ONE = float(np.log(np.expm1(1.0)))


def kerple_log_bias(r1: jnp.ndarray, r2: jnp.ndarray, q_positions, k_positions) -> jnp.ndarray:
  """`-r1 · log(1 + r2 · |i - j|)`, float32 `[H, T_q, T_k]` (or `[B, H, T_q, T_k]`)
  from positive `r1`, `r2` `[H]` and integer positions `[T]` (or `[B, T]`)."""
  distance = jnp.abs(relative_distance(q_positions, k_positions))[..., None, :, :]
  distance = distance.astype(jnp.float32)
  r1 = jnp.asarray(r1, jnp.float32)[:, None, None]
  r2 = jnp.asarray(r2, jnp.float32)[:, None, None]
  return -r1 * jnp.log1p(r2 * distance)


class KERPLE(PositionalEncoding):
  """'kerple': learned logarithmic distance penalty per head."""

  def __init__(self, num_heads: int):
    # Two arrays, not one shared: a donated train state must not alias buffers.
    self.raw_r1 = param(jnp.full((num_heads,), _SOFTPLUS_INVERSE_OF_ONE), (HEADS,))
    self.raw_r2 = param(jnp.full((num_heads,), _SOFTPLUS_INVERSE_OF_ONE), (HEADS,))

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs):
    del d_model, max_positions, causal, rngs  # symmetric in i - j; no random init
    return cls(num_heads)

  def attention_bias(self, q_positions, k_positions):
    """-> float32 `[1|B, H, T_q, T_k]`."""
    f32 = lambda a: a[...].astype(jnp.float32)
    return heads_rank4(kerple_log_bias(jax.nn.softplus(f32(self.raw_r1)),
                                       jax.nn.softplus(f32(self.raw_r2)),
                                       q_positions, k_positions))

  def score_contribution(self, context):
    """`attention_bias` at the call's positions, as a `DenseBias`."""
    return dense_spec(self.attention_bias(context.q_positions, context.k_positions),
                      not_linear(self))
