"""Logit soft-capping (Gemma 2; Team Gemma 2024, arXiv 2408.00118): each score
s becomes `c · tanh(s / c)`, smooth and bounded to (-c, c), so that no logit
grows without bound.

Where it acts, on every kernel that serves it: after the 1/√D scale AND
after the additive position biases (ALiBi, a difference bias, a dense
`bias=`), then the mask. Gemma 2's reference, MaxText
(`attn_logits_soft_cap`) and JAX's splash kernel cap `q·k · scale` and then
mask, with no additive bias in their models; we cap the whole logit the
softmax sees, bias included, so that the bound holds whatever the encoding.
A masked score is replaced by `MASK_VALUE` after the cap, never capped to
-c (which would leave the key visible).

Arithmetic in float32 whatever the input dtype.
"""

import math
import numbers

import jax.numpy as jnp


def check_soft_cap(logit_soft_cap) -> None:
  """Refuses anything but None or a positive finite real number (a Python or
  NumPy scalar: the cap is a constant of the kernels)."""
  if logit_soft_cap is None:
    return
  if isinstance(logit_soft_cap, bool) or not isinstance(logit_soft_cap, numbers.Real):
    raise TypeError(f'logit_soft_cap={logit_soft_cap!r} ({type(logit_soft_cap).__name__}): '
                    'use a positive finite number (e.g. 50.0, Gemma 2\'s), or None.')
  if not (math.isfinite(logit_soft_cap) and logit_soft_cap > 0):
    raise ValueError(f'logit_soft_cap={logit_soft_cap!r}: use a positive finite number '
                     '(e.g. 50.0, Gemma 2\'s), or None for no cap.')


def soft_cap(scores, cap):
  """`cap · tanh(scores / cap)`, float32 or wider (cap None: scores unchanged)."""
  if cap is None:
    return scores
  scores = scores.astype(jnp.promote_types(scores.dtype, jnp.float32))
  return cap * jnp.tanh(scores / cap)


def soft_cap_slope(capped, keep, cap):
  """d capped / d uncapped = 1 - tanh², from the capped scores: the factor
  the blockwise backwards multiply dS by. 0 where not `keep` (there the
  score holds MASK_VALUE, whose square would overflow)."""
  return jnp.where(keep, 1.0 - jnp.square(capped / cap), 0.0)
