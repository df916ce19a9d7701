"""The encodings the config checks build (`lab.config.validate`): once per setting,
and their build errors read as config keys."""

import functools
from typing import Optional

from flax import nnx

from attention_jax.positional import ENCODINGS
from attention_jax.positional import make_encoding


def _frozen(value):
  return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


@functools.lru_cache(maxsize=128)
def _cached_build(cls, name, d_model, num_heads, max_positions, options):
  del cls  # part of the key: a name registered again is built anew
  return make_encoding(name, d_model=d_model, num_heads=num_heads,
                       max_positions=max_positions, causal=True, rngs=nnx.Rngs(0),
                       **dict(options))


def probe_encoding(name: str, m, max_positions: Optional[int], options):
  """Encoding `name` as the config checks ask it (causal, seed 0, `options`),
  built once per setting: a study validates every run's config, and the
  option, kernel and position checks each ask it. Read-only use only."""
  frozen = tuple(sorted((k, _frozen(v)) for k, v in dict(options or {}).items()))
  try:
    hash(frozen)
  except TypeError:  # an option value of the user's own that cannot be a key
    return make_encoding(name, d_model=m.d_model, num_heads=m.num_heads,
                         max_positions=max_positions, causal=True, rngs=nnx.Rngs(0),
                         **dict(options or {}))
  return _cached_build(ENCODINGS.get(name), name, m.d_model, m.num_heads, max_positions,
                       frozen)


def option_refusal(name: str, options: dict, error: Exception) -> Optional[str]:
  """`error` of building encoding `name` as the config key of the option it
  names ('rope: base=-1.0 must be …' -> 'model.encoding_options.rope.base=
  -1.0 must be …'); None when it names none of `options`."""
  text, prefix = str(error), f'{name}: '
  if text.startswith(prefix) and text[len(prefix):].split('=')[0] in options:
    return f'model.encoding_options.{name}.{text[len(prefix):]}'
  return None
