"""A sweep split over the jobs of a cluster array: which runs are whose.

`study.shard = (INDEX, COUNT)` makes a process train the runs of shard
INDEX of COUNT (`shard_runs`): every shard computes the same assignment from
the whole sweep, so the shards of one array never train the same run. With
`study.shard = ()` the shard comes from SLURM's array variables when they
are set (`from_slurm`), else it is (0, 1), the whole sweep. The study's
outputs wait for every run (`finished`), whichever shard trained it.
"""

import os
from typing import Mapping, Optional, Sequence

import ml_collections

from attention_jax.lab.errors import ConfigError

_SLURM = ('SLURM_ARRAY_TASK_ID', 'SLURM_ARRAY_TASK_COUNT', 'SLURM_ARRAY_TASK_MIN',
          'SLURM_ARRAY_TASK_STEP')


def from_slurm(environ: Mapping[str, str]) -> Optional[tuple[int, int]]:
  """(index, count) of this task of a SLURM job array, or None outside one.

  Task ids need not start at 0 (`--array=1-8`) nor be consecutive
  (`--array=0-15:4`): the index is (ID - MIN) / STEP. Ids listed by hand
  (`--array=1,5,9`) cannot be mapped to 0 … COUNT-1 and are a `ConfigError`
  naming them, as is anything that is not a number."""
  if 'SLURM_ARRAY_TASK_ID' not in environ or 'SLURM_ARRAY_TASK_COUNT' not in environ:
    return None
  shown = ', '.join(f'{k}={environ[k]}' for k in _SLURM if k in environ)
  try:
    task, count = int(environ['SLURM_ARRAY_TASK_ID']), int(environ['SLURM_ARRAY_TASK_COUNT'])
    low = int(environ.get('SLURM_ARRAY_TASK_MIN', 0))
    step = int(environ.get('SLURM_ARRAY_TASK_STEP', 1)) or 1
  except ValueError:
    raise ConfigError(f'invalid SLURM array variables ({shown}): expected integers.') from None
  index, off = divmod(task - low, step)
  if off or not 0 <= index < count:
    raise ConfigError(f'study.shard from SLURM ({shown}) is not an index in 0…{count - 1}: use '
                      'a range like --array=0-N, or pass --config.study.shard="(INDEX,COUNT)".')
  return index, count


def check_shard(shard) -> None:
  """`study.shard` is () or (INDEX, COUNT), COUNT >= 1, INDEX in 0…COUNT-1."""
  shard = tuple(shard)
  if not (shard == () or (
      len(shard) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in shard)
      and shard[1] >= 1 and 0 <= shard[0] < shard[1])):
    raise ConfigError(f'invalid config: study.shard={shard!r} must be (INDEX, COUNT) with '
                      'COUNT >= 1 and INDEX in 0…COUNT-1, e.g. --config.study.shard="(0,4)", '
                      'or () (SLURM_ARRAY_TASK_ID/COUNT when set, else the whole sweep).')


def shard_of(config: ml_collections.ConfigDict,
             environ: Mapping[str, str] = os.environ) -> tuple[int, int]:
  """This process's (index, count): `study.shard`, else SLURM's array
  variables, else (0, 1)."""
  shard = tuple(config.study.get('shard', ()))
  check_shard(shard)
  return shard or from_slurm(environ) or (0, 1)


def stacks_seeds(config: ml_collections.ConfigDict) -> bool:
  """Whether the study trains a setup's seeds in one program: such a group
  is never split between shards."""
  return bool(config.study.vmap_seeds) and len(config.study.seeds) > 1


def shard_runs(names: Sequence[str], index: int, count: int, *,
               setups: Optional[Sequence[str]] = None) -> list[int]:
  """Positions in `names` (one unique name per run, e.g. 'copy/rope/seed0')
  of the runs shard `index` of `count` trains.

  The units dealt out are the runs, or with `setups` (one name per run: its
  setup, e.g. 'copy/rope') the setups, each with all its runs. Units sorted
  by name go round-robin: unit i to shard i % count. It depends on the
  names alone, so it is the same in every shard, whatever is finished.
  """
  keys = list(setups) if setups is not None else list(names)
  units = sorted(set(keys))
  mine = {u for i, u in enumerate(units) if i % count == index}
  return [i for i, key in enumerate(keys) if key in mine]


def assigned(config: ml_collections.ConfigDict, runs: Sequence, index: int,
             count: int) -> set[int]:
  """Run numbers (`plan.Run.number`) of shard `index` of `count` of the
  planned `runs` (dealt by their places 'TASK/LABEL/seedN')."""
  names = [run.place for run in runs]
  setups = [os.path.dirname(n) for n in names] if stacks_seeds(config) else None
  return {runs[i].number for i in shard_runs(names, index, count, setups=setups)}


def finished(runs: Sequence, fresh: dict, workdir: str, report_only: bool):
  """Whether the whole sweep is done, read from its run directories.

  `runs`: the planned `plan.Run` records of the sweep; `fresh`: rows
  evaluated in this process, by run number. Returns (rows of every run in
  sweep order, None) when every run is evaluated with its config, else
  (None, what is missing), or with `report_only` a `ConfigError` saying it.
  """
  rows, missing = [], []
  for run in runs:
    found = fresh[run.number] if run.number in fresh else run.rows()
    rows += found or []
    missing += [] if found else [os.path.relpath(run.directory, workdir)]
  if not missing:
    return rows, None
  verb = 'is' if len(missing) == 1 else 'are'
  left = f'{len(missing)} of the {len(runs)} runs {verb} not finished (first: {missing[0]})'
  if report_only:
    raise ConfigError(f'study.report_only: {left}; train them first (the same command '
                      'without study.report_only, or its shards).')
  return None, left
