"""Hard-ALiBi (Jelassi et al. 2024, "Repeat After Me", arXiv 2402.01032).

No positional encoding at all, except that in every layer the first M heads
only see a hard window of the latest tokens: windowed head h (0-based, h < M)
lets query i attend to key j only when `0 <= i - j < w_h`; the other
`num_heads - M` heads attend causally with no bias (NoPE heads). The windowed
heads find "the token before this one" (an n-gram hash of the recent past)
without positions, the NoPE heads look that n-gram up anywhere in the context:
the mechanism the paper proves copies strings of any length.

As a bias on the scores, float32 `[H, T_q, T_k]` (or `[B, H, T_q, T_k]`):

    bias[h, i, j] = 0            if h >= M (NoPE head)
                  = 0            if h <  M and 0 <= i - j < w_h
                  = MASK_VALUE   otherwise

with `i - j` the difference of the *positions* (so cached decoding and
explicit positions see the same windows), built with `jnp.where` from the
finite `attention_jax.attention.MASK_VALUE`, never -inf.

Matching the official code (sjelassi/transformers_ssm_copy,
synthetic_exps/models/hard_alibi_model.py, `GPTHardAlibiAttention._attn`):

* Widths: masked head i (0-based) keeps the diagonals j = 0 … i, i.e. width
  w_i = i + 1: widths 1, 2, …, M. That is our default (`widths=()`);
  `widths=(…)` sets any other positive widths, one per windowed head.
* Outside the window the official code adds `torch.finfo(dtype).min` (a
  finite minimum, as here), not an ALiBi slope with a cut-off: the name is
  the paper's, the bias is a pure 0 / -large mask. Inside the window there is
  no distance penalty at all.
* The windowed heads are the first M heads (`--num_masked_heads`, default 8
  of 12 heads); the same heads in every layer.
* Where paper and code differ we follow the code. Two quirks of that code we
  do not copy because they are not part of the positional scheme: its masks
  are built from matrix indices rather than positions (equal without a cache),
  and with GPT-NeoX's default `rotary_pct=0.25` it concatenates the
  non-rotary part of q and k a second time (`torch.cat((query, query_pass))`),
  which only reweights some q·k features, a re-parametrisation of W_Q.

Bidirectional attention (`causal=False`, not in the paper) uses the symmetric
window `|i - j| < w_h`. Our default M is `num_heads // 2` (the paper's 8 of
12 is 2/3; with 4 heads that would leave one free head).
"""

from typing import Optional, Sequence

import jax.numpy as jnp
import numpy as np

from attention_jax.attention import MASK_VALUE
from attention_jax.attention.scores import WindowBias
from attention_jax.attention.scores import relative_distance
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import heads_rank4


def default_widths(num_windowed_heads: int) -> tuple[int, ...]:
  """The official widths: 1, 2, …, num_windowed_heads."""
  return tuple(range(1, num_windowed_heads + 1))


def check_windows(num_heads: int, num_windowed_heads: Optional[int],
                  widths: Sequence[int], name: str) -> tuple[int, ...]:
  """Resolves (num_windowed_heads, widths) to one width per windowed head;
  a ValueError naming the bad value otherwise. `num_windowed_heads` None
  means len(widths), or with no widths the default M = num_heads // 2."""
  widths = tuple(widths or ())
  for w in widths:
    if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1:
      raise ValueError(f'{name}: widths={widths!r} must be integers >= 1 (one per '
                       f'windowed head); got {w!r}.')
  m = num_windowed_heads
  if m is None and len(widths) > num_heads:
    raise ValueError(f'{name}: widths={widths!r} gives {len(widths)} windowed heads (one '
                     f'width each) but there are num_heads={num_heads}; give at most '
                     f'{num_heads} widths.')
  if m is None:
    m = len(widths) if widths else num_heads // 2
  if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not 0 <= m <= num_heads:
    raise ValueError(f'{name}: num_windowed_heads={m!r} must be an integer in 0 … '
                     f'num_heads={num_heads}.')
  if widths and len(widths) != m:
    raise ValueError(f'{name}: widths={widths!r} has {len(widths)} entries but '
                     f'num_windowed_heads={m}; give one width per windowed head.')
  return tuple(int(w) for w in widths) if widths else default_widths(m)


def hard_alibi_bias(widths: Sequence[int], num_heads: int, q_positions, k_positions,
                    causal: bool = True, offsets: Sequence[int] = ()) -> jnp.ndarray:
  """float32 `[num_heads, T_q, T_k]` (or `[B, num_heads, T_q, T_k]`): 0 inside
  each windowed head's window (`offsets[h] <= i - j < offsets[h] + widths[h]`,
  offsets default 0) and for the free heads, MASK_VALUE elsewhere."""
  m = len(widths)
  w = np.zeros((num_heads, 1, 1), np.int32)
  w[:m, 0, 0] = widths
  o = np.zeros((num_heads, 1, 1), np.int32)
  o[:len(offsets), 0, 0] = offsets
  windowed = (np.arange(num_heads) < m)[:, None, None]
  d = relative_distance(q_positions, k_positions)[..., None, :, :]  # a head axis of 1
  inside = (d >= o) & (d < o + w) if causal else jnp.abs(d) < w
  return jnp.where(inside | ~windowed, 0.0, MASK_VALUE).astype(jnp.float32)


def check_offsets(offsets: Sequence[int], widths: Sequence[int], causal: bool) -> tuple[int, ...]:
  """One offset >= 0 per windowed head (all 0 when `offsets` is empty); a
  ValueError naming the bad value otherwise. Bidirectional windows are
  symmetric and take no offsets."""
  offsets = tuple(offsets or ())
  if not offsets:
    return (0,) * len(widths)
  if len(offsets) != len(widths):
    raise ValueError(f'hard_alibi: offsets={offsets!r} has {len(offsets)} entries but there '
                     f'are {len(widths)} windowed heads (widths={tuple(widths)!r}); give one '
                     'offset per windowed head.')
  for o in offsets:
    if isinstance(o, bool) or not isinstance(o, (int, np.integer)) or o < 0:
      raise ValueError(f'hard_alibi: offsets={offsets!r} must be integers >= 0; got {o!r}.')
  if not causal and any(offsets):
    raise ValueError(f'hard_alibi: offsets={offsets!r} need causal attention (bidirectional '
                     'windows are |i - j| < w).')
  return tuple(int(o) for o in offsets)


class HardALiBi(PositionalEncoding):
  """'hard_alibi': M windowed heads (widths w_h) and NoPE heads, no embedding."""

  def __init__(self, num_heads: int, widths: Sequence[int], causal: bool = True,
               offsets: Sequence[int] = ()):
    self.num_heads = num_heads
    self.widths = tuple(int(w) for w in widths)  # static: constants of the graph
    self.causal = causal
    self.offsets = check_offsets(offsets, self.widths, causal)

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs,
            num_windowed_heads: Optional[int] = None, widths: Sequence[int] = (),
            offsets: Sequence[int] = ()):
    """Options: `num_windowed_heads` M (default len(widths), or num_heads // 2
    without widths), `widths` one per windowed head (default 1 … M), and
    `offsets` one per windowed head (default 0; causal only): head h sees
    `offsets[h] <= i - j < offsets[h] + widths[h]`."""
    del d_model, max_positions, rngs
    return cls(num_heads, check_windows(num_heads, num_windowed_heads, widths, 'hard_alibi'),
               causal, offsets)

  def attention_bias(self, q_positions, k_positions):
    """-> float32 `[1|B, H, T_q, T_k]` (the package's rank-4 convention)."""
    return heads_rank4(hard_alibi_bias(self.widths, self.num_heads, q_positions, k_positions,
                                       self.causal, self.offsets))

  def score_contribution(self, context) -> WindowBias:
    """`attention_bias` as a `WindowBias` (O(T) integers, so that a kernel
    can build the windows itself): 0 <= p_i - p_j < w_h causally, |p_i - p_j|
    < w_h otherwise, no bounds for the free heads."""
    free = (None,) * (self.num_heads - len(self.widths))
    highs = tuple(o + w - 1 for o, w in zip(self.offsets, self.widths)) + free
    lows = tuple(o if self.causal else -h
                 for o, h in zip(self.offsets, highs[:len(self.widths)])) + free
    return WindowBias(lows, highs, context.q_positions, context.k_positions,
                      origin='the windows of hard_alibi')
