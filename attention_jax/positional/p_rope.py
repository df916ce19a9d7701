"""p-RoPE: RoPE on the highest frequencies only (Barbero et al., ICLR 2025).

"Round and Round We Go! What makes Rotary Positional Encodings useful?"
finds that trained models use RoPE's highest frequencies for positional
attention patterns and its lowest ones as semantic channels, which are not
robust over long contexts, and proposes to stop rotating the lowest: with
R = ⌊p · D/2⌋ (rounding as below),

    θ_i = base^(-2i/D)   for i = 0 … R - 1   (the R fastest frequencies)
    θ_i = 0              for i = R … D/2 - 1 (not rotated: angle 0)

q and k (never v) are then rotated exactly as by 'rope' (`rope.py`):
⟨R(m) q, R(n) k⟩ still depends on m - n only, and the unrotated pairs add a
plain, position-free q·k term. The exponents stay over the *full* head_dim:
the kept θ_i are RoPE's own, the lowest ones are dropped. p = 1 is 'rope'
exactly, p = 0 is no rotation at all (NoPE).

Not GPT-NeoX's `rotary_pct` (also Hugging Face's `partial_rotary_factor`):
that rotates a prefix of `rotary_pct · D` *dimensions* with frequencies
recomputed over the rotary dimensions only, base^(-2i/(rotary_pct · D)),
which still spans the whole band from 1 down to ~1/base, just more coarsely.
p-RoPE keeps RoPE's fine spectrum and cuts its slow end.

Pairing convention: split halves, as 'rope' (dimension i with i + D/2; the
unrotated pairs are i and i + D/2 for i >= R). Angles come from
`rotation_angles` (float32, reduced modulo 2π exactly), whatever the input
dtype; the result is cast back to the input dtype.

Options: `p` (fraction of the D/2 frequencies rotated, in [0, 1]; default
0.75) and `base` (RoPE's, default 10,000).

Matching the official code
--------------------------
Reference: Google DeepMind's JAX Gemma code, github.com/google-deepmind/gemma,
`gemma/gm/math/_positional_embeddings.py`, `apply_rope(..., rope_proportion)`
(tests/positional/test_p_rope.py transcribes it):
* Rounding, followed: `rope_angles = int(rope_proportion * head_dim // 2)`,
  i.e. the float product p · D floor-divided by 2 (Python evaluates `*` and
  `//` left to right), then `int`. We evaluate the same expression in
  Python floats, so a p whose product p · D rounds just below an even
  integer loses a frequency exactly as there (0.58 · 100 = 57.999…, R = 28).
* Which frequencies: the code pads RoPE's timescales base^(2i/D),
  i < R, with +inf, so positions / timescale = 0 for the rest — the lowest
  frequencies are the ones dropped, the exponents over the full head_dim.
  Ours: θ_i = 0 there; `rotation_angles` gives angle exactly 0 (cos 1, sin 0),
  so those features pass through unchanged, bit for bit.
* Pairing: split halves there too (`jnp.split(inputs, 2, axis=-1)`), so the
  comparison needs no permutation.
* Angle precision, differs: the code computes positions / timescale in
  float32 (error ~ position · 6e-8 rad); ours is exact modulo 2π
  (`angles.py`). Equal to ~1e-6 at the short lengths the test uses.
* `scale_factor` (position interpolation) is not offered here.
* Default p, a choice: 0.75, the paper's best setting in its Gemma 2B runs
  (Wiki perplexity 4.4414 vs RoPE's 4.4627, FlanV2 6.4422 vs 6.4429). The
  code's default `rope_proportion` is 1.0 (plain RoPE); Gemma 4 uses 0.25
  on its global layers (with base 1e6) and 1.0 on its local ones
  (`gemma/gm/nn/gemma4/_gemma4.py`).
"""

import numbers

import numpy as np

from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.rope import apply_rope
from attention_jax.positional.rope import rope_frequencies


def rotated_pairs(head_dim: int, p: float) -> int:
  """R, the number of frequency pairs rotated, as the official code rounds it:
  `int(p * head_dim // 2)` (float product, then floor division)."""
  return int(p * head_dim // 2)


def p_rope_frequencies(head_dim: int, p: float, base: float = 10000.0) -> np.ndarray:
  """θ_i = base^(-2i/head_dim) for i < R = `rotated_pairs(head_dim, p)`, else 0:
  float64 `[head_dim // 2]`."""
  theta = rope_frequencies(head_dim, base)  # validates head_dim
  theta[rotated_pairs(head_dim, p):] = 0.0
  return theta


def _check_options(head_dim, p, base) -> None:
  if head_dim < 2 or head_dim % 2:
    raise ValueError(f'p_rope: head_dim={head_dim} (d_model // num_heads) must be even '
                     'and >= 2 (RoPE rotates pairs).')
  if (isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0):
    raise ValueError(f'p_rope: p={p!r} must be a number in [0, 1] (the fraction of '
                     'the head_dim // 2 frequencies rotated).')
  if isinstance(base, bool) or not isinstance(base, numbers.Real) or not base > 1:
    # base <= 1 would not order the frequencies fastest first.
    raise ValueError(f'p_rope: base={base!r} must be a number > 1.')


class PRoPE(PositionalEncoding):
  """'p_rope': rotates q and k on the R = ⌊p · D/2⌋ highest RoPE frequencies.

  Not a `RoPE` subclass on purpose: the lab's context extension
  (`rope_scaled`, PI/NTK/YaRN) targets `RoPE` modules and is not defined for
  a truncated spectrum.
  """

  def __init__(self, head_dim: int, p: float = 0.75, base: float = 10000.0):
    _check_options(head_dim, p, base)
    self.head_dim = head_dim
    self.p = float(p)  # static: part of the graph
    self.base = float(base)
    self.num_rotated = rotated_pairs(head_dim, p)

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs,
            p: float = 0.75, base: float = 10000.0):
    """Options: `p` in [0, 1] (default 0.75), `base` > 1 (default 10,000)."""
    del max_positions, causal, rngs  # relative like RoPE; no parameters
    return cls(d_model // num_heads, p, base)

  def rotate_queries_keys(self, q, k, q_positions, k_positions):
    """q `[B, T_q, H, D]`, k `[B, T_k, H, D]`, positions `[T]` or `[B, T]`
    -> rotated (q, k), same shapes and dtypes."""
    frequencies = p_rope_frequencies(self.head_dim, self.p, self.base)
    return (apply_rope(q, q_positions, frequencies=frequencies),
            apply_rope(k, k_positions, frequencies=frequencies))
