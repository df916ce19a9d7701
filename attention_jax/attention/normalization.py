"""How a query's scores become attention weights: softmax, or stick-breaking.

Every kernel row of `dispatch.KERNELS` says which normalisations it serves;
`scaled_dot_product_attention(normalization=...)` takes a name or a spec:

* 'softmax' (default): `softmax(scores)` over the visible keys.
* 'stick_breaking' or `StickBreaking(attend_current=...)`: stick-breaking
  attention (Tan et al., ICLR 2025, arXiv 2410.17980; `stick_breaking.py`):
  no softmax; each visible key, from the nearest back to the first, takes a
  share σ(z_ij) of what the later keys left, and whatever is left at the
  start goes to the query's own value (`remainder='value'`, the default) or,
  with `StickBreaking(remainder='head_bias')`, to a learned per-head vector
  that `MultiHeadAttention` adds (the authors' model code, see
  `StickBreaking`).

Stick-breaking needs to know which key is each query's own token: with
`causal=True` query i is key i; over a key/value cache the caller passes
`q_slots` (each query's key index).
"""

import dataclasses
from typing import Optional, Union

NORMALIZATIONS = ('softmax', 'stick_breaking')
REMAINDERS = ('value', 'head_bias')


@dataclasses.dataclass(frozen=True)
class StickBreaking:
  """Stick-breaking attention's options.

  attend_current: whether query i breaks a share for its own key (the
    official `attend_current`; default False, the official default: keys
    j < i only, and the remainder 1 - Σ_j A_ij goes where `remainder` says
    either way).
  remainder: where the remainder r_i = 1 - Σ_j A_ij goes.
    'value' (default): to the query's own value, o_i = Σ_j A_ij v_j + r_i v_i,
    as the official tests (`ref_fwd`) add it. The attention functions do it.
    'head_bias': o_i = GroupNorm(Σ_j A_ij v_j + r_i b_h), b_h a learned
    vector per head starting at zero and the GroupNorm over each head's
    channels, as the authors' model code (`SBAttention`, see
    `attention.stick_breaking`). The vector and the norm are parameters, so
    `MultiHeadAttention` adds them; the attention functions alone return
    Σ_j A_ij v_j (r_i is 1 minus the row sums of the weights).
  """
  attend_current: bool = False
  remainder: str = 'value'

  def __post_init__(self):
    if not isinstance(self.attend_current, bool):
      raise ValueError(f'StickBreaking(attend_current={self.attend_current!r}): use True '
                       'or False.')
    if self.remainder not in REMAINDERS:
      raise ValueError(f'StickBreaking(remainder={self.remainder!r}): choose one of '
                       f'{REMAINDERS}.')


Normalization = Union[str, StickBreaking, None]


def as_normalization(normalization: Normalization) -> Optional[StickBreaking]:
  """'softmax' (or None) -> None; 'stick_breaking' -> `StickBreaking()`; a
  `StickBreaking` -> itself; anything else a ValueError naming the choices."""
  if normalization is None or normalization == 'softmax':
    return None
  if normalization == 'stick_breaking':
    return StickBreaking()
  if isinstance(normalization, StickBreaking):
    return normalization
  raise ValueError(f'normalization={normalization!r}; choose one of {NORMALIZATIONS} '
                   'or a StickBreaking(attend_current=..., remainder=...).')


def name_of(normalization: Optional[StickBreaking]) -> str:
  """The `NORMALIZATIONS` name of a resolved normalisation."""
  return 'softmax' if normalization is None else 'stick_breaking'
