"""Which encoding and which window each layer of a `TransformerLM` has:
`encoding_layers`, checked and expanded into one `LayerSpec` per layer.

Three forms:

* None: every layer has the model's encoding (if it acts inside attention)
  and the model's `sliding_window`;
* layer indices, e.g. `(2, 6, 10, 14, 18)`: those layers have the encoding,
  the others none (NoPE), all with the model's window (the official
  Multi-Token Attention models convolve in a few layers);
* a pattern string, one spec per layer, comma-separated, repeated to cover
  the layers: `NAME` (a registry encoding acting inside attention, or
  `none`) with the model's `sliding_window`, or `NAME/W` with a sliding
  window of the W latest tokens. `'rope/512,rope/512,rope/512,none'` on 8
  layers is the hybrid of the 2025 long-context models: RoPE with a
  sliding window in three layers of four, global attention without an
  encoding in every fourth (Cohere's RNoPE-SWA, Yang et al. 2025, arXiv
  2501.18795; SWAN-GPT, Puvvada et al. 2025, arXiv 2504.08719).

A pattern repeats over the layers, layer i taking spec i mod its length
(cut after the last layer, as Gemma's and Hugging Face's sliding-window
patterns), so a k-spec pattern ending in a global layer makes every k-th
layer global however deep the model is; it may not be longer than the model.
"""

from typing import NamedTuple, Optional

import numpy as np

from attention_jax.positional.base import ATTENTION_HOOKS
from attention_jax.positional.base import hooks_of
from attention_jax.positional.registry import ENCODINGS

WINDOW_SEPARATOR = '/'


class LayerSpec(NamedTuple):
  """One layer's attention: its encoding's registry name (None: no
  encoding, NoPE) and its sliding window (None: every earlier token)."""
  encoding: Optional[str]
  window: Optional[int]


def layer_specs(encoding_layers, *, num_layers: int, encoding: str, in_attention: bool,
                sliding_window: Optional[int]) -> tuple[LayerSpec, ...]:
  """`num_layers` specs from `encoding_layers` (module docstring), or a
  ValueError naming the value and what is allowed. `encoding` is the
  model's encoding, `in_attention` whether it acts inside attention."""
  if isinstance(encoding_layers, str):
    return _pattern(encoding_layers, num_layers, encoding, sliding_window)
  name = encoding if in_attention else None
  if encoding_layers is None:
    return tuple(LayerSpec(name, sliding_window) for _ in range(num_layers))
  if not in_attention:
    raise ValueError(f'encoding_layers={encoding_layers!r}: encoding={encoding!r} does not act '
                     'inside attention (it adds to the embeddings once, or is none), so it has '
                     'no layers to choose; leave encoding_layers=None.')
  chosen = _indices(encoding_layers, num_layers)
  return tuple(LayerSpec(name if i in chosen else None, sliding_window)
               for i in range(num_layers))


def encoded_layers(specs) -> tuple[int, ...]:
  """The indices of the layers that have an encoding."""
  return tuple(i for i, s in enumerate(specs) if s.encoding is not None)


def _indices(layers, num_layers: int) -> frozenset:
  try:
    chosen = tuple(layers)
  except TypeError:
    chosen = None
  ok = chosen is not None and all(
      isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_))
      and 0 <= i < num_layers for i in chosen)
  if not ok or not chosen or len(set(chosen)) != len(chosen):
    raise ValueError(f'encoding_layers={layers!r} must be distinct layer indices in 0 … '
                     f'{num_layers - 1} (num_layers={num_layers}), at least one; a pattern '
                     "string such as 'rope/64,none'; or None for every layer.")
  return frozenset(int(i) for i in chosen)


def _pattern(pattern: str, num_layers: int, encoding: str,
             sliding_window: Optional[int]) -> tuple[LayerSpec, ...]:
  where = f'encoding_layers={pattern!r}'
  parts = [p.strip() for p in pattern.split(',')]
  if not pattern.strip() or any(not p for p in parts):
    raise ValueError(f"{where}: a pattern is comma-separated NAME or NAME/WINDOW specs, one "
                     "per layer (e.g. 'rope/64,rope/64,rope/64,none'); an empty spec is not one.")
  specs = tuple(_spec(p, where, sliding_window) for p in parts)
  if len(specs) > num_layers:
    raise ValueError(f'{where} has {len(specs)} specs, more than num_layers={num_layers}: '
                     'give at most one spec per layer (a shorter pattern repeats).')
  specs = tuple(specs[i % len(specs)] for i in range(num_layers))
  names = [s.encoding for s in specs if s.encoding is not None]
  if names and encoding != names[0]:
    raise ValueError(f'{where} with encoding={encoding!r}: the model\'s encoding is its first '
                     f'encoded layer\'s, {names[0]!r}; pass encoding={names[0]!r}.')
  if not names and encoding != 'none':
    raise ValueError(f"{where} has no encoded layer, so the model's encoding is 'none', not "
                     f'encoding={encoding!r}.')
  return specs


def _spec(text: str, where: str, sliding_window: Optional[int]) -> LayerSpec:
  name, sep, window = text.partition(WINDOW_SEPARATOR)
  name = name.strip()
  if name not in ENCODINGS:
    raise ValueError(f'{where}: {name!r} is not an encoding; choose one of '
                     f'{", ".join(sorted(ENCODINGS))}.')
  if name != 'none' and not hooks_of(ENCODINGS[name]) & ATTENTION_HOOKS:
    raise ValueError(f'{where}: {name!r} adds to the embeddings once, before the first layer, '
                     'so no layer can have it; a pattern names encodings acting inside '
                     'attention, or none.')
  if sep:
    window = window.strip()
    if not window.isdigit() or int(window) < 1:
      raise ValueError(f'{where}: the window in {text!r} must be an integer >= 1 (NAME/W: '
                       'attend to the W latest tokens).')
    width = int(window)
  else:
    width = sliding_window
  return LayerSpec(None if name == 'none' else name, width)
