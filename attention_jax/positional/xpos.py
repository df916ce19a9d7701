"""xPos: RoPE with an exponential decay per frequency (Sun et al., ACL 2023).

"A Length-Extrapolatable Transformer". q at position m and k at position n
are rotated as by RoPE (θ_i = base^(-2i/D), i = 0 … D/2 - 1) and scaled per
frequency pair i:

    q'_m = ζ_i^(+(m - c)/γ) · R(m) q_m,     k'_n = ζ_i^(-(n - c)/γ) · R(n) k_n,
    ζ_i = (2i + 0.4 D) / (1.4 D)  ∈ [2/7, 1),   γ = `scale_base` (512),

so pair i of the score q'_m · k'_n carries ζ_i^((m - n)/γ): the fast
frequencies (small i, small ζ_i) decay with distance fastest, the slow ones
hardly at all, and the centre c cancels. It cancels only because q and k
use the same c.

The centre c is fixed (option `centre`, default 0), not the sequence's
middle: keys are rotated and scaled once, at their own position, and stored
so in the KV cache, which is exact only if a key's scale does not depend on
the length of the sequence it was seen in. A cached key is therefore bit
for bit the key of the full pass. The price is a bounded range: the scales must
stay representable, and we keep every one within [2^-B, 2^B], B = 63 for
float32 and bfloat16 (half their exponent range: q and k entries keep ~2^63
of headroom before overflow and before the subnormals) and B = 7 for
float16 inputs. Since the largest |ln ζ_i| is ln(7/2) ≈ 1.2528 (i = 0, for
every D), that is

    |p - c| <= B · ln 2 · γ / ln(7/2)  =  17,847 positions (float32, γ = 512)
                                        =  1,983 positions (float16, γ = 512),

(`xpos_position_limit`). Static positions (the models' default `arange`) are
checked when traced: a position outside the range is a ValueError naming it.
Traced positions (e.g. decoding with a traced cache slot) cannot be checked
there and are not checked at run time either (that would be a host callback
per layer per step); keep them in range — set `centre` near the middle of
the positions you use to cover 2 × 17,847 of them.

Pairing convention: split halves, as 'rope' (dimension i with i + D/2). The
official code pairs neighbours (2i, 2i+1); the two are the same map up to
the fixed feature permutation π(2i) = i, π(2i+1) = i + D/2, which a learned
projection absorbs: ours(x)[π] = official(x[π]) (tests/positional/test_xpos.py).

Causal only: `causal=False` is refused. For a key after the query (n > m)
the factor ζ^((m - n)/γ) is > 1 and grows exponentially with the distance —
bidirectional attention would amplify far future keys, the opposite of the
decay the paper designs (it evaluates xPos on causal language modelling).

Angles are `rotation_angles` (float32, exact modulo 2π); scales float32,
exp((p - c) · ln ζ_i / γ) with ln ζ_i / γ rounded once from float64
(relative error ~1e-7 · (1 + |p - c| ln ζ_i / γ)). The result is cast back
to the input dtype.

Matching the official code
--------------------------
github.com/microsoft/torchscale, `torchscale/component/xpos_relative_position.py`
(class `XPOS`, last changed in 9d968a2, which fixed `max_pos` of the first
version, `xpos.py`) and its caller `torchscale/component/multihead_attention.py`
(tests/positional/test_xpos.py transcribes both):
* ζ_i = (2i + 0.4 D) / (1.4 D), `scale_base` = 512, q upscaled, k downscaled
  (`downscale=True`): followed.
* Frequencies: the code hard-codes base 10,000 (`fixed_pos_embedding`);
  option `base` here, default 10,000.
* Angles at the absolute positions 0 … T-1 in both; only the *scales* are
  centred. Ours takes any integer positions (randomized, coupled, …); the
  official code always uses 0 … T-1.
* Centre, differs: the official centres the scale exponents on the current
  length, c = ⌈L/2⌉ (`min_pos = -(length + offset) // 2`), so they never
  overflow whatever the length; ours is a fixed `centre` (above).
* Cached decoding, differs: the official caches keys *before* xPos
  (`incremental_state['prev_key']` is stored first) and at every step
  re-applies it to all cached keys (`offset=0`: angles 0 … L-1, centre
  ⌈L/2⌉ for the L keys so far) and to the new query with `offset = L - 1`
  (its angle at L - 1, scale centred on the same ⌈L/2⌉). q and k share the
  centre at each step, so its scores equal the full pass's in exact
  arithmetic, but the centre moves every other step (not bit-exact) and each
  step re-rotates the whole cache, O(L · D) per layer. Ours rotates each key
  once and caches it rotated, like our RoPE.
* Bidirectional use, differs: the official applies xPos in every
  self-attention when `xpos_rel_pos=True`, encoders included
  (`EncoderConfig`); we refuse causal=False (above).
* The paper's blockwise causal attention at inference is not part of the
  encoding (not implemented).
"""

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.positional.angles import rotation_angles
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.rope import check_rotary_inputs
from attention_jax.positional.rope import rope_frequencies


def xpos_zeta(head_dim: int) -> np.ndarray:
  """ζ_i = (2i + 0.4 D) / (1.4 D), float64 `[head_dim // 2]`, in [2/7, 1)."""
  return (np.arange(0, head_dim, 2, dtype=np.float64) + 0.4 * head_dim) / (1.4 * head_dim)


def xpos_log_rates(head_dim: int, scale_base: float) -> np.ndarray:
  """ln ζ_i / γ, float64 `[head_dim // 2]` (all < 0): the log-scale per position."""
  return np.log(xpos_zeta(head_dim)) / scale_base


def _headroom_bits(dtype) -> int:
  """B: scales are kept within [2^-B, 2^B], half the dtype's exponent range."""
  return (int(jnp.finfo(dtype).maxexp) - 1) // 2


def xpos_position_limit(head_dim: int, scale_base: float, dtype=jnp.float32) -> int:
  """The largest |position - centre| whose scales all lie in [2^-B, 2^B]
  (B = 63 for float32/bfloat16, 7 for float16); at most 2^24, below which
  float32 holds the offset exactly."""
  steepest = float(np.max(np.abs(xpos_log_rates(head_dim, scale_base))))
  return min(math.floor(_headroom_bits(dtype) * math.log(2) / steepest), 2**24)


def _check_static_range(positions, centre: int, limit: int, dtype, head_dim: int,
                        scale_base: float, what: str) -> None:
  try:
    concrete = np.asarray(positions)  # static positions: check at trace time
  except jax.errors.TracerArrayConversionError:
    return  # traced: documented, not checked
  if not concrete.size:
    return
  lo, hi = int(concrete.min()), int(concrete.max())
  if lo - centre < -limit or hi - centre > limit:
    raise ValueError(
        f'xpos: {what} positions range over [{lo}, {hi}] but with centre={centre} and '
        f'scale_base={scale_base:g} (head_dim {head_dim}, {jnp.dtype(dtype).name}) the '
        f'scales stay representable only for positions {centre - limit} … {centre + limit} '
        f'(|position - centre| <= {limit}); move `centre` or raise `scale_base`.')


def apply_xpos(x: jnp.ndarray, positions: jnp.ndarray, *, frequencies: np.ndarray,
               log_rates: np.ndarray, centre: int = 0, downscale: bool = False,
               ) -> jnp.ndarray:
  """Rotate `x` `[..., T, H, D]` by integer `positions` `[..., T]` and scale
  pair i by ζ_i^(±(p - centre)/γ) (− with `downscale`, for keys).

  `frequencies` θ and `log_rates` ln ζ / γ are static `[D/2]` arrays. The
  range is not checked here (`XPos` checks static positions). Returns an
  array like `x`.
  """
  positions = check_rotary_inputs('apply_xpos', x, positions)
  angles = rotation_angles(positions, frequencies)  # [..., T, D/2]; checks the dtype
  # Integer subtraction first: p - c is exact, and exact in float32 below 2^24.
  offset = (positions.astype(jnp.int32) - jnp.int32(centre)).astype(jnp.float32)
  rates = jnp.asarray(-log_rates if downscale else log_rates, jnp.float32)
  scale = jnp.exp(offset[..., None] * rates)
  cos = (jnp.cos(angles) * scale)[..., None, :]  # [..., T, 1, D/2]: shared by heads
  sin = (jnp.sin(angles) * scale)[..., None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def _check_options(head_dim, causal, base, scale_base, centre) -> None:
  if head_dim < 2 or head_dim % 2:
    raise ValueError(f'xpos: head_dim={head_dim} (d_model // num_heads) must be even '
                     'and >= 2 (it rotates pairs).')
  if not causal:
    raise ValueError(
        'xpos: causal=False is not supported: the factor ζ^((m - n)/scale_base) decays '
        'for keys before the query but grows exponentially for keys after it; use '
        'xpos in causal attention only (or rope / p_rope bidirectionally).')
  if isinstance(base, bool) or not isinstance(base, numbers.Real) or not base > 1:
    raise ValueError(f'xpos: base={base!r} must be a number > 1.')
  if (isinstance(scale_base, bool) or not isinstance(scale_base, numbers.Real)
      or not 0 < scale_base < math.inf):
    raise ValueError(f'xpos: scale_base={scale_base!r} must be a finite number > 0 '
                     '(γ; the official default is 512).')
  if (isinstance(centre, bool) or not isinstance(centre, numbers.Integral)
      or abs(centre) >= 2**30):
    raise ValueError(f'xpos: centre={centre!r} must be an integer with |centre| < 2^30 '
                     '(the position whose scales are 1).')


class XPos(PositionalEncoding):
  """'xpos': rotates q and k as RoPE and scales them by ζ^(±(p - centre)/γ).

  Not a `RoPE` subclass on purpose: the lab's context extension
  (`rope_scaled`) targets `RoPE` modules only.
  """

  def __init__(self, head_dim: int, base: float = 10000.0, scale_base: float = 512.0,
               centre: int = 0, causal: bool = True):
    _check_options(head_dim, causal, base, scale_base, centre)
    self.head_dim = head_dim
    self.base = float(base)  # static: constants of the graph
    self.scale_base = float(scale_base)
    self.centre = int(centre)
    # Read by attention modules, which refuse an encoding built for the other
    # kind of attention (here always True: causal=False is refused above).
    self.causal = True

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs,
            base: float = 10000.0, scale_base: float = 512.0, centre: int = 0):
    """Options: `base` > 1 (RoPE's, default 10,000), `scale_base` γ > 0
    (default 512, the official), `centre` (integer, default 0)."""
    del max_positions, rngs  # no table, no parameters
    return cls(d_model // num_heads, base, scale_base, centre, causal)

  def position_limit(self, dtype=jnp.float32) -> int:
    """The largest |position - centre| allowed for inputs of `dtype`."""
    return xpos_position_limit(self.head_dim, self.scale_base, dtype)

  def check_position_range(self, lo: int, hi: int, dtype=jnp.float32) -> None:
    _check_static_range(np.array([lo, hi]), self.centre, self.position_limit(dtype), dtype,
                        self.head_dim, self.scale_base, 'query and key')

  def rotate_queries_keys(self, q, k, q_positions, k_positions):
    """q `[B, T_q, H, D]`, k `[B, T_k, H, D]`, positions `[T]` or `[B, T]`
    -> (q upscaled, k downscaled), same shapes and dtypes."""
    frequencies = rope_frequencies(self.head_dim, self.base)
    log_rates = xpos_log_rates(self.head_dim, self.scale_base)
    for x, positions, what in ((q, q_positions, 'query'), (k, k_positions, 'key')):
      _check_static_range(positions, self.centre, self.position_limit(x.dtype), x.dtype,
                          self.head_dim, self.scale_base, what)
    q = apply_xpos(q, q_positions, frequencies=frequencies, log_rates=log_rates,
                   centre=self.centre, downscale=False)
    k = apply_xpos(k, k_positions, frequencies=frequencies, log_rates=log_rates,
                   centre=self.centre, downscale=True)
    return q, k
