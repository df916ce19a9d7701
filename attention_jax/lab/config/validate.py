"""Config checks that run before anything compiles, in two steps.

1. Every field on its own, and every study entry's model (`field_checks`).
2. Every run the config asks for (task × model kind × entry), resolved into
   its record (`resolved.resolve`) and checked on the facts the record
   holds (`run_checks`), then whether its evaluation fits (`eval_budget`).

Each failure is one `ConfigError` (a `ValueError`) naming the key, its value
and what is allowed; the entry points print it alone and exit 2, before any
file is written.
"""

import ml_collections

from attention_jax.lab.config import field_checks
from attention_jax.lab.config import run_checks
from attention_jax.lab.config.resolved import ResolvedRun
from attention_jax.lab.config.resolved import resolve
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.evaluate import eval_budget

_PREFIX = 'invalid config: '


def validate_config(config: ml_collections.ConfigDict, *,
                    study: bool = False) -> list[ResolvedRun]:
  """Checks one run's config, or with `study=True` every run of the sweep
  (a run's seed changes only its parameters, so each setup is checked once,
  at the config's own `train.seed`). Returns the records checked: for one
  run, its record (`checked_run`)."""
  entries = field_checks.check_fields(config, study=study)
  records = []
  for c in _run_shapes(config, entries, study=study):
    run = _resolved(c)
    refusal = run_checks.refusal(run)
    if refusal is not None:
      raise ConfigError(_PREFIX + refusal)
    records.append(run)
  # An evaluation that cannot fit is refused now, not after every model trained.
  models = eval_budget.models_at_once(
      config, stacked_seeds=config.study.get('vmap_seeds', True)) if study else 1
  for name in (config.study.tasks if study else (config.task.name,)):
    c = config.copy_and_resolve_references()
    c.task.name = name
    eval_budget.check(c, models)
  return records


def checked_run(config: ml_collections.ConfigDict) -> ResolvedRun:
  """One run's config, checked (`validate_config`), as its record."""
  return validate_config(config)[0]


def _run_shapes(config: ml_collections.ConfigDict, entries: list, *,
               study: bool = False) -> list[ml_collections.ConfigDict]:
  """The config of each run `config` asks for, its seed aside: tasks ×
  model kinds × (the transformer `entries`' configs, `check_fields`', or
  the kind alone), or `[config]`."""
  if not study:
    return [config]
  out = []
  for task in config.study.tasks:
    for kind in config.study.models:
      for entry in (entries if kind == 'transformer' else [config]):
        c = entry.copy_and_resolve_references()
        c.task.name, c.model.kind = task, kind
        out.append(c)
  return out


def _resolved(config: ml_collections.ConfigDict) -> ResolvedRun:
  """`resolve(config)`, a bad value of the task's (its options, packing,
  coupled ids, `eval.tasks`) as a ConfigError naming the task."""
  try:
    return resolve(config)
  except ValueError as e:
    text = str(e)
    text = text[len(_PREFIX):] if text.startswith(_PREFIX) else text
    raise ConfigError(f'{_PREFIX}task {config.task.name!r}: {text}') from None
