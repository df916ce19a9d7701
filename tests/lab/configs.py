"""The lab tests' configs: a preset's config with fields set by keyword,
and the one line a bad one is refused with."""

import contextlib
import io

import ml_collections

from attention_jax.lab.runs import process


def with_fields(config: ml_collections.ConfigDict, **fields) -> ml_collections.ConfigDict:
  """`config` with each `section__field=value` (also `'section.field'`, or a
  top-level `field=value`) set in place; returns it."""
  for key, value in fields.items():
    section, _, field = key.replace('.', '__').rpartition('__')
    (config[section] if section else config)[field] = value
  return config


def exit_line(run) -> str:
  """Runs `run()`, which must exit 2, and returns its one line of stderr."""
  stderr = io.StringIO()
  try:
    with contextlib.redirect_stderr(stderr):
      run()
  except SystemExit as e:
    assert e.code == process.USAGE_ERROR, (e.code, stderr.getvalue())
  else:
    raise AssertionError(f'no exit; stderr: {stderr.getvalue()}')
  lines = stderr.getvalue().strip().splitlines()
  assert len(lines) == 1, stderr.getvalue()
  return lines[0]
