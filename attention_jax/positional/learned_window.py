"""A learned soft window per head: Hard-ALiBi whose widths are trained.

Ours (not from a paper). Like Hard-ALiBi (`hard_alibi.py`, Jelassi et al.
2024) there is no positional embedding; the first M heads are windowed, the
others attend causally with no bias (NoPE heads). Windowed head h adds a
log-sigmoid gate of the distance d = i − j (positions) to its scores:

    bias[h, i, j] = log σ(τ_h · (w_h − ½ − d))          (causal; |d| otherwise)
    w_h = softplus(raw_w_h),   τ_h = softplus(raw_τ_h)

* For d well inside the window (d < w_h − ½) the gate is ≈ 0: the head sees
  those tokens as a NoPE head would; past it the bias falls linearly,
  −τ_h (d − w_h + ½): ALiBi with slope τ_h, shifted by the window.
* As τ_h → ∞ it is exactly Hard-ALiBi with width w_h (integer w_h): keys
  with 0 <= d < w_h get 0, the rest −∞. The ½ puts the soft edge halfway
  between the last key inside (d = w_h − 1) and the first outside.
* Both w_h and τ_h are trained (w_h gets a gradient τ(1 − σ(·)) from every
  key past the edge; `learn_temperature=False` keeps τ fixed). Widths start
  at Hard-ALiBi's 1, 2, …, M (`init_widths` for others), τ at `temperature`
  (4: bias −0.13 at the last key inside, −2.1 at the first outside, then
  −4 per token), so at initialisation it is already nearly Hard-ALiBi and
  training moves the edges and sharpens or softens them.

The bias is finite everywhere (`jax.nn.log_sigmoid` is stable), float32
`[H, T_q, T_k]` (or `[B, H, T_q, T_k]`); free heads get 0.
"""

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import heads_rank4
from attention_jax.positional.base import dense_spec
from attention_jax.positional.base import not_linear
from attention_jax.positional.hard_alibi import check_windows
from attention_jax.attention.scores import relative_distance
from attention_jax.positional.parameters import param


def _inverse_softplus(x: np.ndarray) -> np.ndarray:
  return np.log(np.expm1(np.asarray(x, np.float64))).astype(np.float32)


def learned_window_bias(widths: jnp.ndarray, temperatures: jnp.ndarray, num_heads: int,
                        q_positions, k_positions, causal: bool = True) -> jnp.ndarray:
  """`log σ(τ (w − ½ − d))` for the M = len(widths) windowed heads, 0 for the
  rest: float32 `[num_heads, T_q, T_k]` (or `[B, num_heads, T_q, T_k]`) from
  positive `widths`, `temperatures` `[M]` and integer positions."""
  m = widths.shape[0]
  d = relative_distance(q_positions, k_positions)[..., None, :, :].astype(jnp.float32)
  if not causal:
    d = jnp.abs(d)
  w = jnp.asarray(widths, jnp.float32)[:, None, None]
  tau = jnp.asarray(temperatures, jnp.float32)[:, None, None]
  gate = jax.nn.log_sigmoid(tau * (w - 0.5 - d))  # [M, T_q, T_k] or [B, M, T_q, T_k]
  if m == num_heads:
    return gate
  free = jnp.zeros(gate.shape[:-3] + (num_heads - m,) + gate.shape[-2:], jnp.float32)
  return jnp.concatenate([gate, free], axis=-3)


class LearnedWindow(PositionalEncoding):
  """'learned_window': M heads with a trained soft window, the rest NoPE."""

  def __init__(self, num_heads: int, init_widths: Sequence[int], temperature: float = 4.0,
               learn_temperature: bool = True, causal: bool = True):
    m = len(init_widths)
    self.num_heads = num_heads
    self.causal = causal
    # One entry per windowed head (M of them): replicated, M need not divide a mesh axis.
    self.raw_width = param(jnp.asarray(_inverse_softplus(init_widths)).reshape(m), (None,))
    raw_tau = jnp.full((m,), _inverse_softplus(temperature), jnp.float32)
    self.raw_temperature = param(raw_tau, (None,)) if learn_temperature else raw_tau

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs,
            num_windowed_heads: Optional[int] = None, init_widths: Sequence[int] = (),
            temperature: float = 4.0, learn_temperature: bool = True):
    """Options: `num_windowed_heads` M (default len(init_widths), or
    num_heads // 2), `init_widths` (default 1 … M), `temperature` τ's start
    (> 0), `learn_temperature` (train τ too)."""
    del d_model, max_positions, rngs  # deterministic initialisation
    widths = check_windows(num_heads, num_windowed_heads, init_widths, 'learned_window')
    if not (isinstance(temperature, (int, float)) and np.isfinite(temperature)
            and temperature > 0):
      raise ValueError(f'learned_window: temperature={temperature!r} must be a finite '
                       'number > 0.')
    return cls(num_heads, widths, float(temperature), bool(learn_temperature), causal)

  def widths(self) -> jnp.ndarray:
    """Current widths w_h `[M]`."""
    return jax.nn.softplus(self.raw_width[...].astype(jnp.float32))

  def temperatures(self) -> jnp.ndarray:
    """Current sharpness τ_h `[M]`."""
    return jax.nn.softplus(jnp.asarray(self.raw_temperature[...], jnp.float32))

  def attention_bias(self, q_positions, k_positions):
    """-> float32 `[1|B, H, T_q, T_k]` (the package's rank-4 convention)."""
    return heads_rank4(learned_window_bias(self.widths(), self.temperatures(), self.num_heads,
                                           q_positions, k_positions, self.causal))

  def score_contribution(self, context):
    """`attention_bias` at the call's positions, as a `DenseBias`."""
    return dense_spec(self.attention_bias(context.q_positions, context.k_positions),
                      not_linear(self))
