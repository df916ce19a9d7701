"""A workdir holds one study.

Its top-level results.csv, summary.md and figure cover every run in it that
matches the study's config (`outputs.other_runs`), so a second, different
study in the same workdir (another task, another model or training recipe)
would replace them and leave the first study's runs out. `check` refuses
that before anything is written, naming the run and the fields that differ,
as `lab.config.identity` refuses a run directory trained with another config. What
a workdir may hold besides this sweep's runs: runs of earlier sweeps of the
same config (other `study.encodings`/`seeds`/`models`, another evaluation)
and runs trained toward another `train.num_steps` (an extension).
`study.on_mismatch='retrain'` lets a workdir hold other configs' runs
(the outputs list them as left out), and the siblings it trains into
(`seed0-2`) are another config's by design: neither is refused.
"""

import os
import re

import ml_collections

from attention_jax.lab.config import entries
from attention_jax.lab.config import identity
from attention_jax.lab.runs import plan
from attention_jax.lab.errors import ConfigError


def candidate(config: ml_collections.ConfigDict, stored: ml_collections.ConfigDict
              ) -> ml_collections.ConfigDict:
  """The config `config`'s study would have trained the run `stored` (a
  run's config.json) with: its place in a sweep and its entry's fields from
  `stored`, everything else from `config`."""
  out = ml_collections.ConfigDict(config.to_dict())
  for key in identity.RUN_KEYS:
    section, field = key.split('.')
    out[section][field] = stored[section][field]
  variant = stored['model'].get('variant')
  if variant:  # its entry's fields, from this config
    try:
      out = entries.entry_config(out, variant)
    except ValueError:
      pass  # not an entry this config knows: its fields differ
    else:
      out.task.name = stored.task.name
      out.model.kind = stored.model.kind
  return out


def check(config: ml_collections.ConfigDict, workdir: str, runs: list) -> None:
  """Refuses `config`'s study in a `workdir` holding a run of another study
  (module docstring); `runs`, the planned runs, are checked by `lab.runs.plan`."""
  if identity.on_mismatch(config) == 'retrain' or not os.path.isdir(workdir):
    return
  planned = {os.path.abspath(r.directory) for r in runs}
  for path in plan.run_directories(workdir, 'config.json'):
    run_dir = os.path.dirname(path)
    if os.path.abspath(run_dir) in planned or re.fullmatch(r'.*-\d+', run_dir):
      continue  # planned, or a sibling an explicit study.on_mismatch=retrain made
    stored = identity.read_config(run_dir)
    if stored is None:
      continue  # unreadable: named as left out in summary.md, never trusted
    rel = os.path.relpath(run_dir, workdir)
    hint = ('a workdir holds one study: use a new --workdir (or '
            '--config.study.on_mismatch=retrain to keep both, the other\'s runs left out of '
            'the outputs).')
    if stored.task.name not in config.study.tasks:
      raise ConfigError(f'--workdir={workdir} holds a study of task {stored.task.name!r} '
                        f'({rel}); this config studies study.tasks={tuple(config.study.tasks)}; '
                        + hint)
    diffs = [d for d in identity.differences(stored, candidate(config, stored))
             if d[0] != 'train.num_steps']  # an extension, not another study
    if diffs:
      shown = ', '.join(f'{k}={o!r} (this config: {n!r})' for k, o, n in diffs[:4])
      more = f' and {len(diffs) - 4} more fields' if len(diffs) > 4 else ''
      raise ConfigError(f'--workdir={workdir} holds another study: {rel} was trained with '
                        f'{shown}{more}; ' + hint)
