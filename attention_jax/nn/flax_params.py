"""Parameters between `MultiHeadAttention` and `flax.nnx.MultiHeadAttention`.

The two modules' projections have the same layouts (query/key/value kernels
`[in, H, D]` (key/value `H_kv` heads), out `[H, D, out]`, biases `[H, D]`
and `[out]`); only the names differ: ours `W_Q`, `W_K`, `W_V`, `W_O`,
Flax's `query`, `key`, `value`, `out`. Their defaults differ too: ours
`use_bias=False`, Flax's True; build ours with `use_bias=True` to hold a
Flax checkpoint. Each way takes the source's `nnx.State` of `nnx.Param`
and the module it goes into:

    flax_mha = nnx.MultiHeadAttention(num_heads=8, in_features=512, decode=False,
                                      rngs=nnx.Rngs(0))
    ours = aj.MultiHeadAttention(num_heads=8, in_features=512, causal=False,
                                 use_bias=True, rngs=nnx.Rngs(0))
    nnx.update(ours, aj.nn.from_flax(nnx.state(flax_mha, nnx.Param), ours))
    nnx.update(flax_mha, aj.nn.to_flax(nnx.state(ours, nnx.Param), flax_mha))

after which `ours(x)` is `flax_mha(x)` (and a `causal=True` module is
`flax_mha(x, is_causal=True)`). The target is what makes the conversion
checkable: `nnx.update` itself takes a kernel of another shape without a
word. Values take the target's parameter dtypes.

Refused, with a one-line ValueError naming the parameter: biases on one side
only; Flax's `normalize_qk` LayerNorm scales (`query_ln`, `key_ln`), which
ours does not have; our parameters Flax has no place for (an encoding's,
under `positional`, and scalable softmax's `ssmax_scale`); shapes that
differ. `from_flax` leaves the target's own encoding parameters as they
are. Settings without parameters (a RoPE or ALiBi encoding, a sliding
window, stick-breaking) do not travel: Flax's module has none of them.
"""

from typing import Any

import jax.numpy as jnp
from flax import nnx

OURS_TO_FLAX = {'W_Q': 'query', 'W_K': 'key', 'W_V': 'value', 'W_O': 'out'}
FLAX_TO_OURS = {flax: ours for ours, flax in OURS_TO_FLAX.items()}
NORMALIZE_QK = ('query_ln', 'key_ln')
OURS, FLAX = 'MultiHeadAttention', 'flax.nnx.MultiHeadAttention'
_SIZES = 'num_heads, in_features, num_kv_heads, out_features, in_kv_features'


def _params(state: Any, name: str) -> dict[tuple, Any]:
  """{path: array} of the `nnx.Param`s of a State (or of a module)."""
  if isinstance(state, nnx.Module):
    state = nnx.state(state, nnx.Param)
  if not isinstance(state, nnx.State):
    raise TypeError(f'{name} must be an nnx.State of nnx.Param (nnx.state(module, nnx.Param)) '
                    f'or the module itself, got {type(state).__name__}.')
  return {tuple(str(k) for k in path): (v[...] if isinstance(v, nnx.Variable) else v)
          for path, v in nnx.to_flat_state(state)
          if isinstance(v, nnx.Param) or not isinstance(v, nnx.Variable)}


def _annotations(state: Any) -> dict[tuple, dict]:
  """{path: sharding metadata} of the `nnx.Param`s of a module (or State), so
  that converted parameters keep the target's logical axis names."""
  if isinstance(state, nnx.Module):
    state = nnx.state(state, nnx.Param)
  keys = ('out_sharding', 'eager_sharding')
  return {tuple(str(k) for k in path): {k: v.get_metadata()[k] for k in keys
                                        if k in v.get_metadata()}
          for path, v in nnx.to_flat_state(state) if isinstance(v, nnx.Param)}


def _dotted(path: tuple) -> str:
  return '.'.join(path)


def _convert(source: dict, target: dict, names: dict, src: str, dst: str,
             annotations: dict) -> nnx.State:
  """`source`'s projections renamed by `names` into `target`'s paths, checked
  against `target` (biases on both sides or neither, equal shapes), with the
  target's `annotations` (`nnx.update` replaces a variable's metadata)."""
  converted = {}
  for path, value in source.items():
    new = (names[path[0]],) + path[1:]
    if new not in target:
      if path[-1] == 'bias':
        raise ValueError(f'{src}\'s {_dotted(path)} has no place in the {dst}, built with '
                         'use_bias=False: build it with use_bias=True.')
      raise ValueError(f'{src}\'s {_dotted(path)} has no counterpart {_dotted(new)} in the '
                       f'{dst}.')
    want = target[new]
    if tuple(value.shape) != tuple(want.shape):
      raise ValueError(f'{src}\'s {_dotted(path)} is {tuple(value.shape)} but the {dst}\'s '
                       f'{_dotted(new)} is {tuple(want.shape)}: build both with the same '
                       f'sizes ({_SIZES}).')
    converted[new] = nnx.Param(jnp.asarray(value, want.dtype), **annotations.get(new, {}))
  for path in target:
    if path[0] in names.values() and path not in converted:
      if path[-1] == 'bias':
        raise ValueError(f'the {dst} has {_dotted(path)} but the {src} state has no bias '
                         f'(built with use_bias=False): build the {dst} with use_bias=False.')
      raise ValueError(f'the {src} state has nothing for the {dst}\'s {_dotted(path)}: pass '
                       'nnx.state(module, nnx.Param) of the whole module.')
  return nnx.from_flat_state(converted)


def from_flax(flax_state: nnx.State, target: Any) -> nnx.State:
  """Flax's parameters as a State for our module, for `nnx.update(target, ·)`.

  Args:
    flax_state: `nnx.state(flax_mha, nnx.Param)` of a
      `flax.nnx.MultiHeadAttention` (or the module itself).
    target: the `MultiHeadAttention` to update (or its `nnx.state(·,
      nnx.Param)`): its names, shapes, biases and dtypes are checked.

  Returns:
    `nnx.State` of `nnx.Param` at `W_Q`, `W_K`, `W_V`, `W_O` (`kernel`, and
    `bias` with use_bias=True), in the target's dtypes; other parameters of
    the target (an encoding's, `ssmax_scale`) are left out, so unchanged.
  """
  annotations = _annotations(target)
  source, target = _params(flax_state, 'flax_state'), _params(target, 'target')
  for path in source:
    if path[0] in NORMALIZE_QK:
      raise ValueError(f'{_dotted(path)} is Flax\'s normalize_qk LayerNorm, which '
                       f'{OURS} does not have: only a Flax module built with '
                       'normalize_qk=False converts.')
    if path[0] not in FLAX_TO_OURS:
      raise ValueError(f'{_dotted(path)} is not a parameter of {FLAX}\'s projections (query, '
                       'key, value, out): pass nnx.state(flax_mha, nnx.Param).')
  return _convert(source, target, FLAX_TO_OURS, 'Flax', OURS, annotations)


def to_flax(our_state: nnx.State, target: Any) -> nnx.State:
  """Our parameters as a State for Flax's module, for `nnx.update(target, ·)`.

  Args:
    our_state: `nnx.state(ours, nnx.Param)` of a `MultiHeadAttention` (or
      the module itself).
    target: the `flax.nnx.MultiHeadAttention` to update (or its
      `nnx.state(·, nnx.Param)`): names, shapes, biases and dtypes checked.

  Returns:
    `nnx.State` of `nnx.Param` at `query`, `key`, `value`, `out` (`kernel`,
    and `bias` with use_bias=True), in the target's dtypes.
  """
  annotations = _annotations(target)
  source, target = _params(our_state, 'our_state'), _params(target, 'target')
  for path in source:
    if path[0] == 'positional':
      raise ValueError(f'{_dotted(path)} (the encoding\'s parameter) has no place in {FLAX}: '
                       'only a module whose encoding has no parameters converts.')
    if path[0] == 'ssmax_scale':
      raise ValueError(f'ssmax_scale (scalable softmax) has no place in {FLAX}: only a module '
                       'built with scalable_softmax=None converts.')
    if path[0] not in OURS_TO_FLAX:
      raise ValueError(f'{_dotted(path)} is not a parameter of {OURS}\'s projections (W_Q, '
                       'W_K, W_V, W_O): pass nnx.state(ours, nnx.Param).')
  for path in target:
    if path[0] in NORMALIZE_QK:
      raise ValueError(f'the {FLAX} has {_dotted(path)} (normalize_qk=True), which {OURS} '
                       'has no counterpart of: build it with normalize_qk=False.')
  return _convert(source, target, OURS_TO_FLAX, OURS, FLAX, annotations)
