"""Early checks of argument values shared by the public functions and
modules: counts, flags, rates, arrays, key lengths and masks. Each refusal
is a `ValueError` (a bad value) or `TypeError` (a value of the wrong kind)
naming the argument, the value and what is allowed, raised before any JAX
work so that no deep JAX error (a ZeroDivisionError, a broadcasting
TypeError) or silent result stands in for it.

Concrete values (Python, NumPy, a JAX array outside a trace) are checked
eagerly; a traced value (under `jit`, `grad`, `vmap`) has no value to
check, so only its shape and dtype are (each check says what holds then).
"""

import math
import numbers
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np


def _label(owner: Optional[str]) -> str:
  return f'{owner}: ' if owner else ''


def check_count(owner: Optional[str], name: str, value, *, minimum: int = 1) -> int:
  """`value` as an int >= `minimum`: an int or NumPy integer, not a bool nor
  a float (4.0 is refused, not truncated: a float count is usually a
  mistake upstream)."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
    # A ValueError, as the library's other counts (a float count is a bad
    # value more than a wrong type).
    raise ValueError(f'{_label(owner)}{name}={value!r} must be an integer >= {minimum}, '
                     f'got {type(value).__name__}.')
  if value < minimum:
    raise ValueError(f'{_label(owner)}{name}={value!r} must be an integer >= {minimum}.')
  return int(value)


def check_flag(owner: Optional[str], name: str, value) -> bool:
  """`value` as a bool: True/False or a NumPy bool. A string is refused
  ("no" is truthy), and so is a number: a flag is said with a bool."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f'{_label(owner)}{name}={value!r} must be True or False, got '
                    f'{type(value).__name__}.')
  return bool(value)


def check_rate(owner: Optional[str], name: str, value) -> float:
  """`value` as a float in [0, 1) (a dropout rate)."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
    raise TypeError(f'{_label(owner)}{name}={value!r} must be a number in [0, 1), got '
                    f'{type(value).__name__}.')
  if not 0.0 <= value < 1.0:
    raise ValueError(f'{_label(owner)}{name}={value!r} must be in [0, 1).')
  return float(value)


def is_concrete(x) -> bool:
  """Whether `x` has a value now (not a tracer of `jit`, `grad` or `vmap`)."""
  return not isinstance(x, jax.core.Tracer)


def check_lengths(name: str, lengths, batch: int, max_length: int):
  """Key (or prompt) lengths: integer `[batch]`, each in [0, max_length].

  Shape and dtype are always checked; the values only when concrete. Under
  `jit` a value outside the range is not refused: a negative length then
  masks every key of its row (a zero output), one above `max_length` masks
  none."""
  if lengths is None:
    return None
  if not (hasattr(lengths, 'shape') or isinstance(lengths, (list, tuple))):
    raise TypeError(f'{name} must be an integer array [batch], got {type(lengths).__name__}.')
  if is_concrete(lengths):
    array = np.asarray(lengths)
    _check_lengths_array(name, array, batch)
    if array.size and (array.min() < 0 or array.max() > max_length):
      raise ValueError(f'{name}={array.tolist()} must lie in [0, {max_length}] (the number '
                       'of keys).')
    return jnp.asarray(lengths)
  _check_lengths_array(name, lengths, batch)
  return lengths


def _check_lengths_array(name, lengths, batch):
  if not jnp.issubdtype(lengths.dtype, jnp.integer):
    raise TypeError(f'{name} must be an integer array [batch={batch}], got '
                    f'{lengths.dtype}{list(lengths.shape)}.')
  if tuple(lengths.shape) != (batch,):
    raise ValueError(f'{name} must be an integer array [batch={batch}], got shape '
                     f'{tuple(lengths.shape)}.')


def as_bool_mask(name: str, mask):
  """A mask as booleans (True = attend). A float mask of exact 0s and 1s
  (Flax's `nnx.make_attention_mask`, `nnx.make_causal_mask`) is converted
  when concrete; any other float values, or a traced float mask (under
  `jit` its values cannot be checked), are refused with the conversion to
  write. Other dtypes (integers) are refused."""
  if mask is None:
    return None
  if not hasattr(mask, 'dtype'):
    raise TypeError(f'{name} must be a boolean array (True = attend), got '
                    f'{type(mask).__name__}.')
  if mask.dtype == jnp.bool_:
    return mask
  hint = f'pass {name}.astype(bool) (True = attend)'
  if not jnp.issubdtype(mask.dtype, jnp.floating):
    raise TypeError(f'{name} must be boolean (True = attend), got {mask.dtype}: {hint}.')
  if not is_concrete(mask):
    raise TypeError(f'{name} is a traced {mask.dtype} array (under jit its values cannot be '
                    f'checked to be 0 or 1): {hint}.')
  values = np.asarray(mask)
  if not np.all((values == 0) | (values == 1)):
    raise ValueError(f'{name} is {mask.dtype} with values other than 0 and 1, which is not a '
                     f'mask (an additive bias goes to bias=): {hint}.')
  return jnp.asarray(values != 0)


_KINDS = {'floating': (jnp.floating, 'a floating'), 'integer': (jnp.integer, 'an integer'),
          'bool': (jnp.bool_, 'a boolean')}


def check_array(name: str, x, *, ndim=None, kind: Optional[str] = None):
  """`x` as an array of rank `ndim` (an int, a tuple of ranks, or None: any)
  whose dtype is of `kind` ('floating', 'integer', 'bool' or None: any
  number), else a TypeError (not an array, wrong dtype) or ValueError
  (wrong rank) naming `name`. Lists and tuples of numbers are taken as
  arrays; strings and other objects are refused."""
  if isinstance(x, (list, tuple, numbers.Number, np.bool_)) and not isinstance(x, str):
    try:
      x = jnp.asarray(x)
    except (TypeError, ValueError) as e:
      raise TypeError(f'{name} must be an array, got {x!r:.60}: {e}') from None
  if not (hasattr(x, 'shape') and hasattr(x, 'dtype')):
    raise TypeError(f'{name} must be an array, got {type(x).__name__} {x!r:.60}.')
  if isinstance(x, np.ndarray):
    x = jnp.asarray(x)
  if not (jnp.issubdtype(x.dtype, jnp.number) or x.dtype == jnp.bool_):
    raise TypeError(f'{name} must be a numeric array, got dtype {x.dtype}.')
  ranks = (ndim,) if isinstance(ndim, int) else ndim
  if ranks is not None and x.ndim not in ranks:
    raise ValueError(f'{name} must have rank {" or ".join(map(str, ranks))}, got shape '
                     f'{tuple(x.shape)}.')
  if kind is not None:
    base, said = _KINDS[kind]
    if not jnp.issubdtype(x.dtype, base):
      raise TypeError(f'{name} must be {said} array, got {x.dtype}.')
  return x


def check_finite(name: str, x) -> None:
  """Refuses NaN or ±inf in a small concrete array of parameters (slopes, sink
  logits: a NaN there would be hidden by a kernel's running max, not
  propagated); a traced one is not checked."""
  if x is not None and is_concrete(x) and not np.all(np.isfinite(np.asarray(x))):
    raise ValueError(f'{name} must be finite, got {np.asarray(x).tolist()}.')


def check_qkv(q, k, v, name: str = 'attention'):
  """q `[B, T_q, H, D]`, k `[B, T_k, H_kv, D]`, v `[B, T_k, H_kv, D_v]`, floating,
  H_kv dividing H -> (q, k, v); else an error naming the array at fault."""
  q, k, v = (check_array(n, x, kind='floating') for n, x in (('q', q), ('k', k), ('v', v)))
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f'{name} takes [batch, length, heads, head_dim] arrays q, k, v; got '
                     f'q {q.shape}, k {k.shape}, v {v.shape}.')
  need = ('need q [B, T_q, H, D_k], k [B, T_k, H_kv, D_k], v [B, T_k, H_kv, D_v] with '
          'H_kv dividing H')
  for n, x in (('k', k), ('v', v)):
    if x.shape[0] != q.shape[0]:
      raise ValueError(f'incompatible shapes: {n} has batch {x.shape[0]}, q {q.shape[0]} '
                       f'(q {q.shape}, k {k.shape}, v {v.shape}); {need}.')
  if k.shape[3] != q.shape[3]:
    raise ValueError(f'incompatible shapes: k has head_dim {k.shape[3]}, q {q.shape[3]} '
                     f'(q {q.shape}, k {k.shape}); {need}.')
  if v.shape[1:3] != k.shape[1:3]:
    raise ValueError(f'incompatible shapes: v {v.shape} and k {k.shape} need the same '
                     f'length and heads; {need}.')
  if k.shape[2] < 1 or q.shape[2] % k.shape[2]:
    raise ValueError(f'incompatible shapes: key/value heads ({k.shape[2]}) must divide the '
                     f'{q.shape[2]} query heads of q; {need}.')
  return q, k, v
