"""A study's plan: one `Run` record per model it trains and evaluates.

`plan_study` expands a study config into its runs (tasks × model kinds ×
entries × seeds, in that order), resolves and validates each run's config
and finds each run's directory, before anything is created or trained; the
study then only executes the records. A record derives everything that
names a run: its place `TASK/LABEL/seedN` under the workdir, its directory,
its hash, its trained-model and evaluation fields.
"""

import dataclasses
import glob
import hashlib
import json
import os
from typing import Optional

import ml_collections

from attention_jax.lab.config import entries
from attention_jax.lab.config import identity
from attention_jax.lab.config import facts
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.config.validate import checked_run
from attention_jax.lab.config.validate import validate_config
from attention_jax.lab.config.resolved import ResolvedRun

def config_hash(config: ml_collections.ConfigDict, extensions: tuple = ()) -> str:
  """12 hex digits identifying what a run computes: its trained-model and
  evaluation fields (`lab.config.identity`) without the seed, so equal for two seeds
  of one setup and different when any hyperparameter, the task, the encoding
  or the evaluation differ; and, for a run trained longer than first planned,
  its `identity.extensions` (steps and counts, not dates): not the model
  `config` trains from step 0."""
  fields = dict(identity.trained_fields(config), **identity.evaluation_fields(config))
  fields.pop('train.seed', None)
  if extensions:  # only then: the hash of a run never extended stays as it was
    fields['extensions'] = [{k: e[k] for k in ('from_step', 'previous_num_steps', 'num_steps')}
                            for e in extensions]
  text = json.dumps(fields, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def place(config: ml_collections.ConfigDict) -> str:
  """Where a study keeps `config`'s run under its workdir: 'TASK/LABEL/seedN'."""
  return os.path.join(config.task.name, entries.run_label(config), f'seed{config.train.seed}')


# Every run directory of a workdir (and the siblings `seedN-2`, … of `identity`).
RUN_PATTERN = os.path.join('*', '*', 'seed*')


def run_directories(workdir: str, filename: str = '') -> list[str]:
  """The workdir's run directories holding `filename` (any, if ''), sorted;
  with `filename`, the paths of those files."""
  pattern = os.path.join(glob.escape(workdir), RUN_PATTERN, filename)
  return sorted(p.rstrip(os.sep) for p in glob.glob(pattern)
                if filename or os.path.isdir(p))


@dataclasses.dataclass(frozen=True)
class Run:
  """One run of a study: the record of what it trains and evaluates
  (`config.resolved`, resolved once when planning, never changed), its
  number in the sweep (from 1), and its directory: `WORKDIR/place`, or a
  sibling `place-N` when that holds this config's model (`identity.resolve`)."""
  number: int
  resolved: ResolvedRun
  place: str
  directory: str

  @property
  def config(self) -> ml_collections.ConfigDict:
    """The run's completed config (encoding options filled in)."""
    return self.resolved.config

  @property
  def task(self) -> str:
    return self.config.task.name

  @property
  def label(self) -> str:
    return entries.run_label(self.config)

  @property
  def seed(self) -> int:
    return self.config.train.seed

  @property
  def setup(self) -> tuple:
    """What the runs of one setup share (they differ in the seed only)."""
    return (self.task, self.config.model.kind, self.label)

  def hash(self) -> str:
    """`config_hash` of this run as it stands (extensions included)."""
    return config_hash(self.config, identity.extensions(self.directory))

  def trained_fields(self) -> dict:
    return identity.trained_fields(self.config)

  def evaluation_fields(self) -> dict:
    return identity.evaluation_fields(self.config)

  def rows(self) -> Optional[list[dict]]:
    """Its results if it is finished with this config, else None."""
    return identity.evaluated_rows(self.directory, self.config)

  def __str__(self) -> str:
    return f'{self.task} {self.label} seed {self.seed}'


def run_configs(config: ml_collections.ConfigDict) -> list[ml_collections.ConfigDict]:
  """One resolved config per run of the sweep, in sweep order: tasks ×
  (transformer entries, other model kinds) × seeds (`entries` for the
  grammar of an entry). A ValueError names a bad entry."""
  out = []
  for task in config.study.tasks:
    for kind in config.study.models:
      for entry in (config.study.encodings if kind == 'transformer' else ('none',)):
        for seed in config.study.seeds:
          c = entries.entry_config(config, entry)
          c.task.name, c.model.kind, c.train.seed = task, kind, seed
          out.append(facts.resolve_options(c))
  return out


def check_layout(workdir: str) -> None:
  """Refuses a workdir of the older layout (`WORKDIR/runs/TASK/LABEL/seedN`)
  instead of training its runs again beside it."""
  old = os.path.join(workdir, 'runs')
  if glob.glob(os.path.join(glob.escape(old), RUN_PATTERN, 'config.json')):
    raise ConfigError(
        f'{workdir} holds runs in the older layout ({old}/TASK/LABEL/seedN; now '
        f'{workdir}/TASK/LABEL/seedN): move them up with `mv {old}/* {workdir}/ && rmdir '
        f"{old}` (a label 'NAME+stick_breaking' is now 'NAME:stick_breaking'), or use a "
        'new --workdir.')


def plan_study(config: ml_collections.ConfigDict, workdir: str) -> list[Run]:
  """Every run of the study `config` into `workdir`, validated, each with
  its directory (`identity.resolve_all`: a mismatch with what a directory
  holds is one `RunMismatch` before anything is created)."""
  validate_config(config, study=True)
  check_layout(workdir)
  try:
    configs = run_configs(config)
  except ValueError as e:
    raise ConfigError(f'invalid config: study.encodings: {e}') from None
  # Every run's config checked, and resolved, before anything compiles.
  records = [checked_run(c) for c in configs]
  places = [place(c) for c in configs]
  dirs = identity.resolve_all([(os.path.join(workdir, p), c) for p, c in zip(places, configs)])
  return [Run(i, r, p, d) for i, (r, p, d) in enumerate(zip(records, places, dirs), 1)]


def setups(runs: list[Run]) -> list[list[Run]]:
  """Consecutive runs that differ only in their seed (sweep order)."""
  groups = []
  for run in runs:
    if groups and groups[-1][0].setup == run.setup:
      groups[-1].append(run)
    else:
      groups.append([run])
  return groups

