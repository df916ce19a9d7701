"""One grammar for what a study sweeps: an entry is `BASE[:PART[:PART …]]`.

* BASE: an encoding's registry name (`rope`, `alibi`, …) or the name of a
  partial config in the table below (`mta_lookup`, …).
* PART: the name of a partial config in the same table.

The table is `PARTS` (how positions are drawn, the normalization) and the
config's `study.variants` (named models: `mta_lookup`, `ngram_lookup`, or a
user's): every name is a partial config of `model`, `task` and `train`
fields that replaces the config's, applied left to right. A string value
holding `{}` wraps the value the field had (`coupled`: `{}:coupled`, so
`rope:coupled` is `model.encoding='rope:coupled'`).

The entry is the run's label: results.csv's `encoding` column and its folder
(`WORKDIR/TASK/LABEL/seedN`). A stored config gives its label back
(`run_label`): `model.variant` when an entry names a variant, else the
encoding spec, with `:stick_breaking` for that normalization.
"""

import copy
from typing import Mapping

import ml_collections

from attention_jax.positional import ENCODINGS

# Built-in parts: how positions are drawn and how scores become weights.
PARTS = {
    # Positions drawn at random from a larger range (Ruoss et al. 2023).
    'randomized': dict(model=dict(encoding='{}:randomized')),
    # Position coupling (Cho et al. 2024): an output carries its input's id.
    'coupled': dict(model=dict(encoding='{}:coupled')),
    # Stick-breaking attention (Tan et al. 2025) instead of softmax.
    'stick_breaking': dict(model=dict(normalization='stick_breaking')),
}
SEPARATOR = ':'
_SECTIONS = ('model', 'task', 'train')


def flatten(tree, prefix: str = '') -> dict:
  """{'a': {'b': 1}} -> {'a.b': 1} (an empty group has no fields)."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(flatten(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = value
  return out


def variants(config: ml_collections.ConfigDict) -> dict:
  """`config.study.variants` as a plain dict (none in a config without it)."""
  found = (config.get('study') or {}).get('variants')
  return found.to_dict() if found else {}


def table(config: ml_collections.ConfigDict) -> dict:
  """Every name an entry may use besides an encoding: `PARTS` and the
  config's variants (a variant may not take a built-in part's name)."""
  named = variants(config)
  clash = sorted(set(named) & set(PARTS))
  if clash:
    raise ValueError(f'study.variants.{clash[0]}: the name of a built-in part '
                     f'({", ".join(PARTS)}); give the variant another name.')
  return {**PARTS, **named}


def _apply(config: ml_collections.ConfigDict, name: str, partial: dict) -> None:
  """Replaces `config`'s fields with `partial`'s, in place; a field the
  config lacks is a ValueError naming it (an encoding's options may be new)."""
  for key, value in flatten(partial).items():
    section = key.partition('.')[0]
    if section not in _SECTIONS:
      raise ValueError(f'{name}.{key}: a partial config sets model, task and train fields '
                       f'only, not {section!r}.')
    *parents, field = key.split('.')
    node = config
    for i, part in enumerate(parents):
      if part not in node:
        if parents[:i] != ['model', 'encoding_options']:
          raise ValueError(f'{name}.{key}: the config has no {".".join(parents[:i + 1])}.')
        node[part] = ml_collections.ConfigDict()
      node = node[part]
    if field not in node and parents[:2] != ['model', 'encoding_options']:
      raise ValueError(f'{name}.{key}: the config has no such field.')
    if isinstance(value, str) and '{}' in value:
      value = value.format(node[field])
    node[field] = value


def entry_config(config: ml_collections.ConfigDict, entry: str) -> ml_collections.ConfigDict:
  """A copy of `config` for the study entry `entry`, its label in
  `model.variant` when it begins with a variant. A ValueError names a bad
  entry and what is allowed."""
  if not isinstance(entry, str) or not entry:
    raise ValueError(f'study entry {entry!r} must be a non-empty string BASE[:PART…].')
  if '+' in entry:
    raise ValueError(f'study entry {entry!r}: parts follow a colon, e.g. '
                     f"{entry.replace('+', SEPARATOR)!r}.")
  names = table(config)
  base, *parts = entry.split(SEPARATOR)
  c = copy.deepcopy(config)  # keeps typed placeholders (None-valued fields) overridable
  c.unlock()  # the entry point's config is locked; an entry may add encoding options
  where = lambda name: f'study.variants.{name}' if name not in PARTS else f'entries.PARTS.{name}'
  if base in names and base not in PARTS:
    if 'model.encoding' not in flatten(names[base]):
      # Else the base config's encoding would stand in unnamed ('abacus' = fire:abacus).
      example = ', '.join(f"'{e}{SEPARATOR}{base}'" for e in ('none', config.model.encoding))
      raise ValueError(f'study entry {entry!r}: the variant {base!r} sets no model.encoding, so '
                       f'it is a part: name the encoding it goes with, e.g. {example}.')
    _apply(c, where(base), names[base])
    c.model.variant = entry
  elif base in ENCODINGS:
    c.model.encoding, c.model.variant = base, ''
  else:
    raise ValueError(
        f'study entry {entry!r}: {base!r} is neither an encoding ({", ".join(sorted(ENCODINGS))}) '
        f'nor a variant ({", ".join(sorted(variants(config))) or "none in this config"}).')
  for part in parts:
    if part not in names:
      raise ValueError(f'study entry {entry!r}: no part {part!r}; the parts are '
                       f'{", ".join(sorted(names))}.')
    _apply(c, where(part), names[part])
  if any(part not in PARTS for part in parts):
    c.model.variant = entry  # a variant's fields are part of the label (`run_label`)
  return c


def run_label(config: ml_collections.ConfigDict) -> str:
  """The label of the run `config` trains (results.csv's `encoding` column):
  the study entry it was made from (`entry_config`), or for anything but a
  transformer its model kind ('seq2seq', 'seq2seq_attention')."""
  if config.model.kind != 'transformer':
    return config.model.kind
  if config.model.get('variant'):
    return config.model.variant
  if config.model.get('normalization', 'softmax') == 'stick_breaking':
    return config.model.encoding + SEPARATOR + 'stick_breaking'
  return config.model.encoding


def tiny_variants(variants: dict) -> dict:
  """`variants` (study.variants' dict) without their own `train.num_steps`:
  at a config's `scale=tiny` every entry trains the preset's few steps (a
  variant's longer budget would make one entry of a smoke test take minutes)."""
  out = {}
  for name, fields in variants.items():
    fields = {k: dict(v) for k, v in fields.items()}
    fields.get('train', {}).pop('num_steps', None)
    out[name] = {k: v for k, v in fields.items() if v}
  return out
