"""The lab tests' configs: a preset's config with fields set by keyword."""

import ml_collections


def with_fields(config: ml_collections.ConfigDict, **fields) -> ml_collections.ConfigDict:
  """`config` with each `section__field=value` (also `'section.field'`, or a
  top-level `field=value`) set in place; returns it."""
  for key, value in fields.items():
    section, _, field = key.replace('.', '__').rpartition('__')
    (config[section] if section else config)[field] = value
  return config
