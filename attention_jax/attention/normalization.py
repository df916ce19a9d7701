"""How a query's scores become attention weights: softmax, or stick-breaking.

Every kernel row of `dispatch.KERNELS` says which normalisations it serves;
`scaled_dot_product_attention(normalization=...)` takes a name or a spec:

* 'softmax' (default): `softmax(scores)` over the visible keys.
* 'stick_breaking' or `StickBreaking(attend_current=...)`: stick-breaking
  attention (Tan et al., ICLR 2025, arXiv 2410.17980; `stick_breaking.py`):
  no softmax; each visible key, from the nearest back to the first, takes a
  share σ(z_ij) of what the later keys left, and whatever is left at the
  start goes to the query's own value.

Stick-breaking needs to know which key is each query's own token: with
`causal=True` query i is key i; over a key/value cache the caller passes
`q_slots` (each query's key index).
"""

import dataclasses
from typing import Optional, Union

NORMALIZATIONS = ('softmax', 'stick_breaking')


@dataclasses.dataclass(frozen=True)
class StickBreaking:
  """Stick-breaking attention's options.

  attend_current: whether query i breaks a share for its own key (the
    official `attend_current`; default False, the official default: keys
    j < i only, and the remainder 1 - Σ_j A_ij goes to v_i either way).
  """
  attend_current: bool = False

  def __post_init__(self):
    if not isinstance(self.attend_current, bool):
      raise ValueError(f'StickBreaking(attend_current={self.attend_current!r}): use True '
                       'or False.')


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
                   'or a StickBreaking(attend_current=...).')


def name_of(normalization: Optional[StickBreaking]) -> str:
  """The `NORMALIZATIONS` name of a resolved normalisation."""
  return 'softmax' if normalization is None else 'stick_breaking'
