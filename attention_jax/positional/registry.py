"""The one place that maps a config string to a positional encoding.

Adding an encoding: write its module (a `PositionalEncoding` subclass with a
`build` classmethod taking the common arguments of `make_encoding` plus its
own keyword options) and add one entry to `ENCODINGS`, or, from outside the
package, call `register_encoding(name, cls)`. `make_encoding`'s `dtype` and
`param_dtype` reach the build through `positional.parameters.precision`
(its `param` and `scope_dtype`), not as keywords: a `build`'s signature
lists the encoding's own options.
"""

import difflib
import inspect
from typing import Optional

import jax.numpy as jnp
from flax import nnx

from attention_jax.attention.checks import check_count
from attention_jax.attention.checks import check_flag
from attention_jax.positional.alibi import ALiBi
from attention_jax.positional.base import NoPE
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.cope import CoPE
from attention_jax.positional.dape import DAPE
from attention_jax.positional.fire import FIRE
from attention_jax.positional.forgetting import FoX
from attention_jax.positional.hard_alibi import HardALiBi
from attention_jax.positional.kerple import KERPLE
from attention_jax.positional.learned import Learned
from attention_jax.positional.learned_window import LearnedWindow
from attention_jax.positional.mta import MultiTokenAttention
from attention_jax.positional.parameters import check_dtypes
from attention_jax.positional.parameters import precision
from attention_jax.positional.p_rope import PRoPE
from attention_jax.positional.path import PaTH
from attention_jax.positional.path import PaTHFoX
from attention_jax.positional.rope import RoPE
from attention_jax.positional.sinusoidal import Sinusoidal
from attention_jax.positional.t5 import T5RelativeBias
from attention_jax.positional.transformer_xl import TransformerXL
from attention_jax.positional.windowed_rope import WindowedRoPE
from attention_jax.positional.xpos import XPos

ENCODINGS = {
    'none': NoPE,
    'sinusoidal': Sinusoidal,
    'learned': Learned,
    'rope': RoPE,
    'alibi': ALiBi,
    't5': T5RelativeBias,
    'kerple': KERPLE,
    'fire': FIRE,  # Li et al. 2024: an MLP of the log distance normalised by max(L, i)
    'hard_alibi': HardALiBi,  # Jelassi et al. 2024: windowed heads + NoPE heads
    'learned_window': LearnedWindow,  # ours: Hard-ALiBi with trained soft widths
    'windowed_rope': WindowedRoPE,  # ours: RoPE + a symmetric id window (for coupling)
    'p_rope': PRoPE,  # Barbero et al. 2025: RoPE on the fraction p of highest frequencies
    'xpos': XPos,  # Sun et al. 2023: RoPE × per-frequency decay ζ^((m - n)/γ), causal only
    'fox': FoX,  # Lin et al. 2025: forget gates σ(w·x + b), bias Σ log f between key and query
    'cope': CoPE,  # Golovneva et al. 2024: positions counted by gates σ(q·k/√D), O(T²)
    'dape': DAPE,  # Zheng et al. 2024: KERPLE/ALiBi bias + an MLP of (q·k/√D, bias) over heads, O(T²)
    'relative': TransformerXL,  # Dai et al. 2019 as Delétang/Ruoss et al. 2023: u, v, sin/cos keys
    'mta': MultiTokenAttention,  # Golovneva et al. 2025: NoPE scores convolved over queries × keys, O(T²)
    'path': PaTH,  # Yang et al. 2025: q·k through Householder transforms read from each token
    'path_fox': PaTHFoX,  # PaTH with FoX's forget gate (FLA's use_forget_gate=True)
}


MODIFIERS = ('randomized', 'coupled')  # coupled: position coupling (Cho et al. 2024), set up by the lab's tasks


# The keywords every `build` takes (from `make_encoding`); the rest are the
# encoding's own options.
COMMON_BUILD_ARGUMENTS = ('d_model', 'num_heads', 'max_positions', 'causal', 'rngs')


def did_you_mean(word, choices) -> str:
  """' Did you mean 'x'?' for the choice closest to `word` (case aside), or ''."""
  if not isinstance(word, str):
    return ''
  choices = list(choices)
  folded = [c for c in choices if c.lower() == word.lower()]
  close = folded or difflib.get_close_matches(word, choices, n=1)
  return f' Did you mean {close[0]!r}?' if close else ''


def encoding_options(name: str) -> tuple[str, ...]:
  """The encoding's own keyword options: its `build`'s keywords beyond the
  common ones (empty when the build takes **kwargs, which names none)."""
  parameters = inspect.signature(ENCODINGS[name].build).parameters.values()
  return tuple(p.name for p in parameters if p.name not in COMMON_BUILD_ARGUMENTS
               and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def register_encoding(name: str, cls: type, *, overwrite: bool = False) -> None:
  """Makes `cls` (a `PositionalEncoding` subclass with a `build` classmethod)
  available as `name` to `make_encoding`, `parse_encoding_spec` and every
  model taking `encoding=name`. A name already taken is an error unless
  `overwrite=True`."""
  check_flag('register_encoding', 'overwrite', overwrite)
  if not isinstance(name, str) or not name or ':' in name:
    raise ValueError(f'encoding name must be a non-empty string without ":" (it '
                     f'separates modifiers such as ":randomized"), got {name!r}.')
  if not (isinstance(cls, type) and issubclass(cls, PositionalEncoding)):
    raise TypeError(f'{cls!r} is not a PositionalEncoding subclass.')
  if not callable(getattr(cls, 'build', None)):
    raise TypeError(f'{cls.__name__} needs a `build` classmethod taking d_model, '
                    'num_heads, max_positions, causal, rngs and its own options.')
  if name in ENCODINGS and not overwrite and ENCODINGS[name] is not cls:
    raise ValueError(f'encoding {name!r} is already registered '
                     f'({ENCODINGS[name].__name__}); pass overwrite=True to replace it.')
  ENCODINGS[name] = cls


def parse_encoding_spec(spec: str) -> tuple[str, bool]:
  """'NAME' or 'NAME:randomized' (how sweeps and presets name an encoding
  trained on randomized positions, Ruoss et al. 2023) -> (NAME, randomized)."""
  if not isinstance(spec, str):
    raise TypeError(f'encoding spec must be a string NAME or NAME:MODIFIER, got '
                    f'{type(spec).__name__} {spec!r}.')
  name, _, modifier = spec.partition(':')
  if name not in ENCODINGS or modifier not in ('',) + MODIFIERS:
    hint = (did_you_mean(name, ENCODINGS) if name not in ENCODINGS
            else did_you_mean(modifier, MODIFIERS))
    raise ValueError(
        f'bad encoding {spec!r}: the spec must be NAME or NAME:MODIFIER '
        f'({"|".join(MODIFIERS)}) with NAME one of {sorted(ENCODINGS)}.{hint}')
  return name, modifier == 'randomized'


def check_encoding_name(name) -> None:
  """Refuses a `name` that is not one of `ENCODINGS` (a TypeError for a
  non-string), with the closest name (or modifier) it may have meant; modules
  call it before making any parameter."""
  if not isinstance(name, str):
    raise TypeError(f'positional encoding name must be a string, one of '
                    f'{sorted(ENCODINGS)}; got {type(name).__name__} {name!r}.')
  if name not in ENCODINGS:
    base, _, modifier = name.partition(':')
    if modifier:
      raise ValueError(
          f'positional encoding {name!r}: ":{modifier}" is a modifier of a sweep spec (one '
          f'of {"|".join(MODIFIERS)}), not part of the encoding name; build {base!r} and pass the '
          'positions to the model call instead (":coupled": '
          'positional.coupled_position_ids, ":randomized": positional.random_positions); '
          'parse_encoding_spec splits a spec.' + (
              did_you_mean(modifier, MODIFIERS) if modifier not in MODIFIERS else '') + (
              '' if base in ENCODINGS else f' {base!r} is not one of {sorted(ENCODINGS)}.'
              + did_you_mean(base, ENCODINGS)))
    raise ValueError(
        f'unknown positional encoding {name!r}: the name must be one of {sorted(ENCODINGS)}.'
        + did_you_mean(name, ENCODINGS))


def make_encoding(
    name: str,
    *,
    d_model: int,
    num_heads: int,
    max_positions: Optional[int] = None,
    causal: bool = True,
    rngs: Optional[nnx.Rngs] = None,
    dtype=None,
    param_dtype=jnp.float32,
    **options,
) -> PositionalEncoding:
  """Builds the encoding called `name`.

  Args:
    name: one of `ENCODINGS`.
    d_model: model width (absolute encodings add vectors of this size).
    num_heads: attention heads (head_dim = d_model // num_heads; ALiBi slopes).
    max_positions: number of positions a table must hold ('learned').
    causal: whether attention is causal (ALiBi's bias differs).
    rngs: for encodings with parameters.
    dtype: the dtype of what the encoding adds to the activations (learned
      and Abacus rows); None: the activations' own. What it adds to the
      scores is float32 whatever `dtype` (`PositionalEncoding`).
    param_dtype: the dtype its parameters are stored in (default float32).
    **options: encoding-specific keywords, e.g. `base=` for 'rope'.
  """
  check_encoding_name(name)
  check_count(name, 'd_model', d_model)
  check_count(name, 'num_heads', num_heads)
  if max_positions is not None:
    check_count(name, 'max_positions', max_positions)
  check_flag(name, 'causal', causal)
  if d_model % num_heads:
    raise ValueError(
        f'num_heads={num_heads} does not divide d_model={d_model}.')
  if rngs is not None and not isinstance(rngs, nnx.Rngs):
    raise TypeError(f'positional encoding {name!r}: rngs must be an nnx.Rngs or None, got '
                    f'{type(rngs).__name__}.')
  own = encoding_options(name)
  unknown = [o for o in options if o not in own]
  if unknown and own:
    raise ValueError(
        f'positional encoding {name!r} got an unknown option among {sorted(options)} '
        f'(encoding_options= or make_encoding\'s keywords): {unknown[0]!r} is not one of '
        f'its options {sorted(own)}.'
        + did_you_mean(unknown[0], own))
  dtype, param_dtype = check_dtypes(f'positional encoding {name!r}', dtype, param_dtype)
  try:
    with precision(dtype, param_dtype):
      encoding = ENCODINGS[name].build(
          d_model=d_model, num_heads=num_heads, max_positions=max_positions,
          causal=causal, rngs=rngs, **options)
  except TypeError as e:
    if 'unexpected keyword' not in str(e):
      raise
    raise ValueError(
        f'positional encoding {name!r} got an unknown option among {sorted(options)} '
        f'(encoding_options= or make_encoding\'s keywords; it takes none: {e}).') from None
  _store_in(encoding, param_dtype)
  return encoding


def _store_in(encoding: PositionalEncoding, param_dtype) -> None:
  """Casts to `param_dtype` any parameter a build made without `param`
  (an encoding registered from outside), so none stays float32 unasked."""
  for _, node in nnx.iter_graph(encoding):
    if isinstance(node, nnx.Param) and node[...].dtype != param_dtype:
      node.set_value(node[...].astype(param_dtype))

