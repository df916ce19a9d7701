"""RoPE with a hard symmetric window on position ids for some heads.

Ours, for position coupling (Cho et al. 2024, `lab/tasks/coupling.py`).
q and k are rotated as in RoPE (`rope.py`) in every head; in addition the
first M heads ("windowed heads") only see keys whose position id is within
`w_h` of the query's, in either direction:

    bias[h, i, j] = 0            if h >= M (a plain RoPE head)
                  = 0            if h <  M and |p_i − p_j| <= w_h
                  = 0            if h <  M, `sink` and p_j == 0
                  = MASK_VALUE   otherwise

with p the *position ids* (not token indices), built with `jnp.where` from
the finite `attention_jax.attention.MASK_VALUE`; the causal mask still
applies on top (token order). Symmetric, because with coupling the key a copy
query needs sits one id *ahead*: the query predicting y_{k+1} carries y_k's
id s + k and must read x_{k+1}, at id s + k + 1. A windowed head therefore
sees a bounded set of keys (at most 2 w_h + 1 ids, each used by an input and
an output token) whatever the length, so nothing beyond the window can
distract it at 4× or 8× the training length.

`sink=True` also opens the keys at id 0 (BOS, EOS and PAD under coupling)
to every windowed head: a fixed place to put attention when nothing in the
window is wanted (e.g. "no x_{n+1}": time for EOS). It is a statement about
the id, not the token.

Options: `windows` (one width >= 0 per windowed head; default `window` for
each of `num_windowed_heads` heads), `window` (default 2), `num_windowed_heads`
(None or -1: len(windows), or all heads), `sink` (default False), `base` (RoPE's).
"""

from typing import Optional, Sequence

import jax.numpy as jnp
import numpy as np

from attention_jax.attention import MASK_VALUE
from attention_jax.attention.scores import NoBias
from attention_jax.attention.scores import WindowBias
from attention_jax.attention.scores import relative_distance
from attention_jax.positional.base import flag_option
from attention_jax.positional.base import heads_rank4
from attention_jax.positional.base import integer_option
from attention_jax.positional.base import real_option
from attention_jax.positional.rope import RoPE


def resolve_windows(num_heads: int, num_windowed_heads: Optional[int],
                    windows: Sequence[int], window: int) -> tuple[int, ...]:
  """One width per windowed head, or a ValueError naming the bad value."""
  windows = tuple(windows or ())
  for w in windows:
    if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 0:
      raise ValueError(f'windowed_rope: windows={windows!r} must be integers >= 0 (one '
                       f'width per windowed head); got {w!r}.')
  window = integer_option('windowed_rope', 'window', window, at_least=0,
                          why='the width of every windowed head without its own')
  m = num_windowed_heads
  if m is None or (isinstance(m, (int, np.integer)) and not isinstance(m, bool) and m == -1):
    m = len(windows) if windows else num_heads
  if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not 0 <= m <= num_heads:
    raise ValueError(f'windowed_rope: num_windowed_heads={m!r} must be an integer in '
                     f'0 … num_heads={num_heads}.')
  if windows and len(windows) != m:
    raise ValueError(f'windowed_rope: windows={windows!r} has {len(windows)} entries but '
                     f'num_windowed_heads={m}; give one width per windowed head.')
  return tuple(int(w) for w in windows) if windows else (int(window),) * m


def windowed_bias(windows: Sequence[int], num_heads: int, q_positions, k_positions,
                  sink: bool = False) -> jnp.ndarray:
  """float32 `[num_heads, T_q, T_k]` (or `[B, num_heads, T_q, T_k]` for
  positions `[B, T]`): 0 where |p_i − p_j| <= w_h (and, with `sink`, at key
  id 0) for the windowed heads h < len(windows), and everywhere for the others;
  MASK_VALUE elsewhere."""
  m = len(windows)
  w = np.zeros((num_heads, 1, 1), np.int32)
  w[:m, 0, 0] = windows
  windowed = (np.arange(num_heads) < m)[:, None, None]
  d = relative_distance(q_positions, k_positions)[..., None, :, :]  # [.., 1, T_q, T_k]
  inside = jnp.abs(d) <= w
  if sink:
    k = jnp.asarray(k_positions, jnp.int32)[..., None, None, :]
    inside = inside | (k == 0)
  return jnp.where(inside | ~windowed, 0.0, MASK_VALUE).astype(jnp.float32)


class WindowedRoPE(RoPE):
  """'windowed_rope': RoPE in every head, a hard symmetric id window in the first M."""

  def __init__(self, head_dim: int, num_heads: int, windows: Sequence[int],
               sink: bool = False, base: float = 10000.0):
    super().__init__(head_dim, base)
    self.num_heads = num_heads
    self.windows = tuple(int(w) for w in windows)  # static: constants of the graph
    self.sink = bool(sink)

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs,
            num_windowed_heads: Optional[int] = None, windows: Sequence[int] = (),
            window: int = 2, sink: bool = False, base: float = 10000.0):
    """Options: `num_windowed_heads` M (None or -1: len(windows), or all heads),
    `windows` one width per windowed head (default `window` each), `window`,
    `sink` (keys at id 0 visible to every windowed head), `base` (RoPE)."""
    del max_positions, causal, rngs  # symmetric by design; no parameters
    windows = resolve_windows(num_heads, num_windowed_heads, windows, window)
    sink = flag_option('windowed_rope', 'sink', sink)
    base = real_option('windowed_rope', 'base', base, above=1,
                       why='RoPE\'s θ_i = base^(-2i/D) must fall with i')
    return cls(d_model // num_heads, num_heads, windows, sink, base)

  def attention_bias(self, q_positions, k_positions):
    if not self.windows:
      return None
    """-> float32 `[1|B, H, T_q, T_k]` (the package's rank-4 convention)."""
    return heads_rank4(windowed_bias(self.windows, self.num_heads, q_positions, k_positions,
                                     self.sink))

  def score_contribution(self, context):
    """`attention_bias` as a `WindowBias` (|p_i - p_j| <= w_h, the sink at id
    0, no bounds for the plain heads), or `NoBias()` with no windowed head."""
    if not self.windows:
      return NoBias()
    free = (None,) * (self.num_heads - len(self.windows))
    return WindowBias(tuple(-w for w in self.windows) + free, self.windows + free,
                      context.q_positions, context.k_positions, sink=self.sink,
                      origin='the windows of windowed_rope')
