"""One runner for every benchmark: shard, lock, train side by side, write
the outputs once.

A benchmark is planned from its config into jobs, each a unit one process
trains under the locks of its directories: the unfinished seeds of one
setup of the decoder study (`runs.study`), or the unrecorded tasks of one
group of DeepMind's suite under the encoder protocol (`runs.suite`). What
a job computes and what the outputs are belong to the benchmark; how jobs
are dealt between the processes of a cluster array, locked, stopped, run
side by side and finished belongs here, so every benchmark has all of it:

1. `study.report_only`: nothing is trained; an unfinished benchmark is
   refused before anything is written.
2. This process's shard (`cluster.shard_of`: `study.shard`, or SLURM's
   array variables) of the unfinished jobs, `study.parallel_setups` at a
   time in threads (`timing.side_by_side`).
3. Before each job: a stop request (SIGTERM, Ctrl-C) or the time budget
   (`train.max_minutes`) ends the invocation, checkpointed, naming the job
   it did not start. Its directories are locked while it trains
   (`locks.hold_all`): a job another process holds is left to it, one line
   naming the holder, or with `study.on_locked='wait'` waited for.
4. The outputs are written under the workdir's `.outputs.lock` by the
   process that finds every result there (the last shard to finish).
"""

import dataclasses
import functools
import os
from typing import Any, Callable, Optional, Protocol

import ml_collections

from attention_jax.lab.runs import cluster
from attention_jax.lab.runs import locks
from attention_jax.lab.runs.timing import side_by_side
from attention_jax.lab.train.interrupt import TIME_BUDGET
from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.train.interrupt import combined
from attention_jax.lab.train.interrupt import raise_if_stopped
from attention_jax.lab.train.interrupt import stop_requests
from attention_jax.lab.train.loop import out_of_time
from attention_jax.lab.train.loop import time_budget


@dataclasses.dataclass(frozen=True)
class Job:
  """One unit of a benchmark that a process trains under its locks.

  Attributes:
    directories: locked while the job trains (its runs' or group's folders).
    prefix: what every line about the job starts with ('[3/12]').
    what: the job in words ('copy rope', 'alibi (lr 0.001) × parity_check').
    work: the benchmark's own description of the job (its runs, its group).
  """
  directories: tuple
  prefix: str
  what: str
  work: Any


class Benchmark(Protocol):
  """What a benchmark gives the runner. Built from a validated config whose
  workdir was checked (a workdir holds one config's runs), before `run`."""
  config: ml_collections.ConfigDict
  workdir: str
  log: Callable[[str], None]

  def refuse_unfinished(self) -> None:
    """`study.report_only`: a `ConfigError` naming what is unfinished, if any."""

  def jobs(self, index: int, count: int) -> list[Job]:
    """The unfinished jobs of shard `index` of `count`, in order; one line
    for each unit found finished."""

  def run_job(self, job: Job, deadline: Optional[float]) -> None:
    """Trains, evaluates and records `job` (its locks held; a unit another
    process finished meanwhile is read, not trained again)."""

  def finish(self) -> None:
    """Work after the jobs that needs no training (the study: hard sets of
    runs evaluated by older code)."""

  def write_outputs(self) -> Any:
    """The outputs, if every result is there (returned); else one line
    saying what is missing (None or [] returned)."""


def run(benchmark: Benchmark) -> Any:
  """Runs this process's share of `benchmark` (module docstring) and
  returns what its `write_outputs` returns."""
  config = benchmark.config
  with stop_requests():
    deadline = time_budget(config)
    if config.study.get('report_only', False):
      benchmark.refuse_unfinished()  # before anything is written
      jobs = []
    else:
      jobs = benchmark.jobs(*cluster.shard_of(config))
    os.makedirs(benchmark.workdir, exist_ok=True)
    side_by_side(functools.partial(_run_job, benchmark, deadline=deadline), jobs,
                 config.study.get('parallel_setups', 1), combine=combined)
    benchmark.finish()
    # One writer at a time: the last two shards may finish together.
    with locks.hold(benchmark.workdir, wait=True, should_stop=raise_if_stopped,
                    name='.outputs.lock'):
      return benchmark.write_outputs()


def _run_job(benchmark: Benchmark, job: Job, *, deadline: Optional[float]) -> None:
  """One job under its locks; a job another process holds is left to it."""
  what = f'before {job.what} (those before it are finished or running)'
  raise_if_stopped(what)
  if out_of_time(deadline):
    raise TrainingInterrupted(
        f'stopped by train.max_minutes={benchmark.config.train.max_minutes:g} {what}; run the '
        'same command again to continue.', None, TIME_BUDGET)
  log = lambda m: benchmark.log(f'{job.prefix} {m}')
  try:
    with locks.hold_all(list(job.directories), wait=locks.waits(benchmark.config), log=log,
                        should_stop=raise_if_stopped):
      benchmark.run_job(job, deadline)
  except locks.RunLocked as e:
    log(f'{job.what}: in training by {e.holder}; left to it')
