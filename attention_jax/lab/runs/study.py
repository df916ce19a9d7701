"""The decoder study: tasks × encodings × seeds, as a benchmark of
`runs.runner`, with the study's outputs.

Its runs are planned first (`runs.plan`), each setup's seeds then trained
and evaluated together (`one_run.train_and_evaluate`); a finished run is
read back instead of retrained, so an interrupted sweep picks up at the
first unfinished run when the same command is run again.
"""

import json
import os
import threading
import time
from typing import Callable, Optional

import ml_collections

from attention_jax.lab.runs import cluster
from attention_jax.lab.config import identity
from attention_jax.lab.runs import locks
from attention_jax.lab.runs import one_study
from attention_jax.lab.report import outputs
from attention_jax.lab.evaluate import hard
from attention_jax.lab.runs import plan
from attention_jax.lab.runs import runner
from attention_jax.lab.runs.timing import describe
from attention_jax.lab.runs.timing import locked
from attention_jax.lab.train.interrupt import raise_if_stopped
from attention_jax.lab.train.interrupt import stage
from attention_jax.lab.train.loop import load_trained
from attention_jax.lab.runs import one_run
from attention_jax.lab.runs.workdir_checks import refuse_another_kind
from attention_jax.lab.runs.one_run import OnTrained


def run_study(config: ml_collections.ConfigDict, workdir: str,
              log: Callable[[str], None] = print,
              on_trained: Optional[OnTrained] = None) -> list[dict]:
  """The sweep. Writes `results.csv`, `summary.md` and `extrapolation.png`
  into `workdir` and the runs into `workdir/TASK/LABEL/seedN/` (LABEL: the
  study entry, `lab.config.entries`). `on_trained` is called as in `one_run.run_one`.

  The study is planned first (`lab.runs.plan`): every run's config is resolved
  and validated and every run directory checked against its config
  (`lab.config.identity`) before anything is created or trained; then the plan's
  records are executed. A finished
  run is reused; one evaluated with other evaluation settings is evaluated
  again from its final checkpoint; one trained toward a smaller
  `train.num_steps` is extended (one line each names them) and evaluated
  again. Every run is also scored on its task's hard set (`evaluate.hard`,
  hard.csv); a finished run without a current hard.csv (evaluated by older
  code) is scored from its final checkpoint, with no training and its
  results.csv untouched. The workdir's outputs cover every run in
  it that matches the current config, also runs of earlier sweeps outside
  this one's tasks/models/encodings/seeds; summary.md lists them.

  On a cluster (`lab.runs.cluster`): this process trains only its shard's runs
  (`study.shard`, or SLURM's array variables). Each run directory is locked
  while it is trained (`lab.runs.locks`): a run another process holds is left to
  it (one line names the holder) or, with `study.on_locked='wait'`, waited
  for. The outputs are written once every run of the sweep is finished, by
  the process that finds it so (the last shard to finish); with
  `study.report_only` nothing is trained and the outputs are written, or
  refused if a run is unfinished. `train.max_minutes` bounds the invocation:
  when it runs out the runs in training checkpoint, no new one starts, and
  `TrainingInterrupted` (exit status `TIME_BUDGET`) is raised with no
  outputs written. Returns the rows written to results.csv, or [] when
  this process wrote none.
  """
  return runner.run(Study(config, workdir, log, on_trained))


class Study:
  """The decoder study as a benchmark of `runs.runner`: its jobs are the
  unfinished runs of one setup (its seeds in one program with
  `study.vmap_seeds`), its outputs `outputs.write_study_outputs`'."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str,
               log: Callable[[str], None], on_trained: Optional[OnTrained] = None):
    refuse_another_kind(workdir, 'study')  # a suite's or one run's: refused, nothing written
    self.runs = plan.plan_study(config, workdir)
    one_study.check(config, workdir, self.runs)  # another study's runs: refused, nothing written
    self.config, self.workdir, self.log = config, workdir, log
    self.tx = one_run.shared_optimizer(config.train)  # one object: runs share compilations
    lock = threading.Lock()  # on_trained may draw (matplotlib is not thread-safe)
    self.on_trained = on_trained and (lambda *a: locked(lock, on_trained, *a))
    self.fresh, self.stale = {}, []  # rows evaluated here by run number; runs lacking hard.csv
    self.start = time.perf_counter()

  def refuse_unfinished(self) -> None:
    cluster.finished(self.runs, self.fresh, self.workdir, report_only=True)

  def jobs(self, index: int, count: int) -> list[runner.Job]:
    mine = cluster.assigned(self.config, self.runs, index, count)
    total = len(self.runs)
    if count > 1:
      self.log(f'shard {index} of {count}: {len(mine)} of the {total} runs')
    out = []
    for group in plan.setups(self.runs):
      todo = _to_train(group, mine, total, self.log, self.stale)
      if todo:
        out.append(runner.Job(directories=tuple(r.directory for r in todo),
                              prefix=f'[{todo[0].number}/{total}]',
                              what=f'{todo[0].task} {todo[0].label}', work=todo))
    return out

  def run_job(self, job: runner.Job, deadline: Optional[float]) -> None:
    """Trains and evaluates the job's unfinished runs; their rows go to
    `fresh` by run number."""
    log = lambda m: self.log(f'{job.prefix} {m}')
    # The process that held them before may have finished them.
    todo = [r for r in job.work if r.rows() is None]
    vmapped = self.config.study.vmap_seeds and len(todo) > 1
    if vmapped:
      log(f'training seeds {[r.seed for r in todo]} of {job.what} in one program')
    group_rows = one_run.train_and_evaluate(
        [r.resolved for r in todo], [r.directory for r in todo], self.tx, self.on_trained, log,
        vmapped=vmapped, deadline=deadline) if todo else []
    for run, run_rows in zip(todo, group_rows):
      _log_run(self.log, f'[{run.number}/{len(self.runs)}]', run, run_rows, self.workdir,
               self.start)
      self.fresh[run.number] = run_rows

  def finish(self) -> None:
    for run in self.stale:
      _add_hard(run, self.config, self.log, len(self.runs))

  def write_outputs(self) -> list[dict]:
    report_only = self.config.study.get('report_only', False)
    rows, left = cluster.finished(self.runs, self.fresh, self.workdir, report_only)
    if left:
      self.log(f'outputs not written yet: {left}; the process that finishes the last one '
               'writes them, or --config.study.report_only=True once they are finished.')
      return []
    extra, coverage = outputs.other_runs(self.workdir, self.config, self.runs)
    covered = ([r.directory for r in self.runs]
               + [os.path.join(self.workdir, d) for d in coverage[1]])
    with stage('while writing the study outputs'):
      return outputs.write_study_outputs(rows + extra, self.workdir, self.config, coverage,
                                         outputs.grid_rows([r.directory for r in self.runs]),
                                         hard_table=outputs.hard_rows(covered))


def _to_train(group: list, mine: set, total: int, log, stale: list) -> list:
  """The runs of one setup this process trains: those of its shard that
  are not finished (one line for each run reused or extended). Finished
  runs without a current hard.csv (`evaluate.hard`) go to `stale`."""
  todo = []
  for run in group:
    if run.number not in mine:
      continue
    done = run.rows()
    if done is not None:
      step = next((r['diverged_at'] for r in done if r.get('diverged_at') is not None), None)
      log(f'[{run.number}/{total}] {run}: finished earlier, reused' + (
          '' if step is None else f'; it DIVERGED at step {step} and stays marked so (not '
          'retrained: the same config diverges the same way; train it with other settings '
          'in a new --workdir)'))
      if not hard.is_current(run.directory, run.resolved):
        stale.append(run)
      continue
    todo.append(run)
    grown = identity.extension(run.directory, run.config)
    if grown:
      log(f"[{run.number}/{total}] {run}: trained to step {grown['from_step']} of "
          f"{grown['previous_num_steps']}; extended to {grown['num_steps']} steps")
  return todo


def _add_hard(run, config, log, total) -> None:
  """Scores a finished run's hard set from its final checkpoint (no
  training; its results.csv untouched), under its lock; a run another
  process holds is left to it."""
  prefix = f'[{run.number}/{total}]'
  try:
    with locks.hold(run.directory, wait=locks.waits(config),
                    log=lambda m: log(f'{prefix} {m}'), should_stop=raise_if_stopped):
      with stage(f'during the hard evaluation of {run.directory} (its training and uniform '
                 'evaluation are finished and kept)'):
        hard.ensure(run.directory, run.resolved, load_trained, lambda m: log(f'{prefix} {m}'))
  except locks.RunLocked as e:
    log(f'{prefix} {run}: held by {e.holder}; its hard set is left to it')


def _log_run(log, prefix, run, run_rows, workdir, start) -> None:
  with open(os.path.join(run.directory, 'run.json')) as f:
    info = json.load(f)
  c = run.config
  # Not rope+…, nor the rows of other tasks scored on the model (eval.tasks).
  own = [r for r in run_rows if r['encoding'] == run.label and r['task'] == run.task]
  in_range = [r['token_accuracy'] for r in own if r['length'] <= c.task.train_max_length]
  where = '' if run.directory == os.path.join(workdir, run.place) else f' ({run.directory})'
  if own and own[0].get('diverged_at') is not None:
    where += f" (DIVERGED at step {own[0]['diverged_at']}, left out of the means)"
  log(f'{prefix} {run}{where}: {describe(info)}, '
      f'token accuracy in training range {100 * sum(in_range) / len(in_range):.1f}%, '
      f"at {own[-1]['length']}: {100 * own[-1]['token_accuracy']:.1f}% "
      f'({time.perf_counter() - start:.0f}s so far)')
