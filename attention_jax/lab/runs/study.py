"""One run (train, then evaluate every length) and the sweep over
tasks × encodings × seeds, with the study's outputs.

Each run writes into its own folder, which belongs to one trained-model
config (`lab.config.identity`). A run evaluated with the current evaluation settings
is finished and is read back instead of retrained, so an interrupted sweep
picks up at the first unfinished run when the same command is run again.
"""

import contextlib
import functools
import json
import os
import threading
import time
from typing import Callable, Optional

import ml_collections
import optax
from flax import nnx

import attention_jax
from attention_jax.lab.runs import cluster
from attention_jax.lab.config import identity
from attention_jax.lab.runs import locks
from attention_jax.lab.runs import one_study
from attention_jax.lab.report import outputs
from attention_jax.lab.evaluate import bucket_floor
from attention_jax.lab.evaluate import evaluate_models
from attention_jax.lab.evaluate import hard
from attention_jax.lab.report import hard_report
from attention_jax.lab.evaluate.grid import evaluate_grid
from attention_jax.lab.evaluate import rope_scaled
from attention_jax.lab.evaluate.context_extension import evaluation_variants
from attention_jax.lab.runs import plan
from attention_jax.lab.runs import runner
from attention_jax.lab.config.entries import run_label
from attention_jax.lab.runs.run_files import write_run
from attention_jax.lab.runs.timing import Stopwatch
from attention_jax.lab.runs.timing import describe
from attention_jax.lab.runs.timing import locked
from attention_jax.lab.train import make_optimizer
from attention_jax.lab.train import train
from attention_jax.lab.train import train_seeds
from attention_jax.lab.train import divergence
from attention_jax.lab.train.interrupt import raise_if_stopped
from attention_jax.lab.train.interrupt import stage
from attention_jax.lab.train.interrupt import stop_requests
from attention_jax.lab.train.loop import load_trained
from attention_jax.lab.train.loop import time_budget
from attention_jax.lab.config.validate import checked_run


OnTrained = Callable[[nnx.Module, ml_collections.ConfigDict, str], None]


def shared_optimizer(train_config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """One optimizer object per optimizer setting, for the whole process: the
  compiled step is memoised on it, so runs (and studies) that share the
  setting compile once per architecture."""
  fields = {k: v for k, v in train_config.to_dict().items()
            if f'train.{k}' not in identity.NOT_TRAINING and k != 'seed'}
  return _optimizer(json.dumps(fields, sort_keys=True, default=str))


@functools.lru_cache(maxsize=16)
def _optimizer(fields_json: str) -> optax.GradientTransformation:
  return make_optimizer(ml_collections.ConfigDict(json.loads(fields_json)))


def run_one(config: ml_collections.ConfigDict, workdir: str,
            tx: Optional[optax.GradientTransformation] = None,
            on_trained: Optional[OnTrained] = None,
            log: Optional[Callable[[str], None]] = None,
            reevaluate: bool = False) -> list[dict]:
  """Trains one model (or resumes it; nothing to do if finished) and
  evaluates it at every length. A finished run already evaluated with these
  evaluation settings is read back (one log line says so) unless
  `reevaluate`.

  `workdir` holding a model trained with another config is refused
  (`lab.config.identity`), or with `study.on_mismatch='retrain'` the run goes to a
  fresh sibling `workdir-N` (logged); one trained toward a smaller
  `train.num_steps` only is trained on to this one and evaluated again (an
  extension, recorded in its `extensions.json`: `identity.extension`). `on_trained(model, config, run_dir)`,
  if given, is called with the trained model (to draw a figure from it, say)
  before evaluation. A stop request (SIGTERM, Ctrl-C) is honoured during
  training, evaluation and the writes (`train.interrupt`), and so is
  `train.max_minutes` during training. The run directory is locked from
  training to the last write (`lab.runs.locks`; `study.on_locked`).

  Writes `metrics.jsonl` (every training step), `results.csv` (one row per
  length) and `run.json` (timings, final training metrics, and the
  evaluation config: when it matches, the run is finished) into the run
  directory, atomically. Returns the rows.
  """
  run = checked_run(config)  # resolved once: every stage below reads the record
  config = run.config
  with stop_requests():
    run_dir = identity.resolve(workdir, config)
    if run_dir != workdir and log:
      log(f'{workdir} holds a run of another config; training into {run_dir}')
    deadline = time_budget(config)
    with locks.hold(run_dir, wait=locks.waits(config), log=log or print,
                    should_stop=raise_if_stopped):
      return _train_and_evaluate([run], [run_dir], tx, on_trained, log, vmapped=False,
                                 reuse=not reevaluate, deadline=deadline)[0]


def _train_and_evaluate(runs, run_dirs, tx, on_trained, log, *, vmapped,
                        reuse=False, deadline=None) -> list[list[dict]]:
  """Trains the runs (`ResolvedRun`s; the seeds of one setup in one
  program when `vmapped`), then evaluates and writes each; returns each
  run's rows. `reuse` (one run): a run that trained no step now keeps its
  current evaluation."""
  configs = [r.config for r in runs]
  tx = tx or shared_optimizer(configs[0].train)
  train_clock = Stopwatch()
  with train_clock.stage('train'):
    if vmapped:
      trained = train_seeds(runs, run_dirs, progress=configs[0].progress, tx=tx,
                            deadline=deadline)
    else:
      trained = [train(r, d, progress=r.config.progress, tx=tx, deadline=deadline)
                 for r, d in zip(runs, run_dirs)]
  # Per run: its share of a program that trained them all at once.
  train_times = train_clock.breakdown(share=len(configs))
  for config, run_dir, (model, _) in zip(configs, run_dirs, trained):
    if on_trained:
      on_trained(model, config, run_dir)
  raise_if_stopped(f'after training {", ".join(run_dirs)} (final checkpoints saved; the '
                   'evaluation runs next time)')
  if reuse and not trained[0][1]:  # no step trained: finished earlier
    try:
      done = identity.evaluated_rows(run_dirs[0], configs[0])
    except ValueError:  # a damaged results.csv: evaluated again
      done = None
    step = divergence.diverged_at(run_dirs[0])
    finished = f'{run_dirs[0]}: ' + (
        f'finished at step {configs[0].train.num_steps}' if step is None else
        f'DIVERGED at step {step} (diverged.json; not retrained: the same config diverges '
        'the same way)')
    if done is not None:
      if log:
        log(f'{finished}; evaluation from {os.path.join(run_dirs[0], "results.csv")} '
            '(--reevaluate to evaluate it again)')
      if run_dirs[0]:  # evaluated by older code: its hard set from the model at hand
        hard.ensure(run_dirs[0], runs[0], lambda *_: trained[0][0], log)
      return [done]
    if log:
      log(f'{finished}; not evaluated with these evaluation settings (or at this step count) '
          'yet')
  # The seeds of a vmapped group are evaluated together too (one program per
  # bucket for all of them); otherwise one run at a time.
  groups = [list(range(len(configs)))] if vmapped else [[i] for i in range(len(configs))]
  out = [None] * len(configs)
  for group in groups:
    names = ', '.join(run_dirs[i] for i in group)
    if log:
      log(f'evaluating {names} at {len(runs[group[0]].eval_lengths)} lengths')
    clock = Stopwatch()
    with stage(f'during the evaluation of {names} (training finished, final checkpoints '
               'saved)'):
      models, members = [trained[i][0] for i in group], [runs[i] for i in group]
      group_rows, timings = _evaluate(models, members, clock, [run_dirs[i] for i in group])
      grids = _evaluate_grid(models, members, clock)
      hards = hard.config_rows(models, members, clock)
    times = dict(train_times, **clock.breakdown(share=len(group)))
    for i, rows, grid, hard_rows in zip(group, group_rows, grids, hards):
      step = divergence.diverged_at(run_dirs[i]) if run_dirs[i] else trained[i][1].get(
          'diverged_at')
      for row in rows:  # a diverged run's rows say so (`train.divergence`)
        row['diverged_at'] = step
      if run_dirs[i] and hard_rows:  # before run.json: a stop between means "evaluate again"
        hard.write_hard(hard.run_hard_path(run_dirs[i]), hard_rows)
        rows = hard_report.with_hard(rows, hard_rows)  # results.csv's hard_exact_match
      write_run(configs[i], run_dirs[i], rows, trained[i][1], times,
                 {k: v / len(group) for k, v in timings.items()},
                 len(configs) if vmapped else 1, grid=grid)
      out[i] = rows
  return out


def _evaluate_grid(trained: list, runs: list, clock: Stopwatch) -> list:
  """Each model's `evaluate.grid` rows (None per model without `eval.grid`)."""
  config = runs[0].config
  if not config.eval.get('grid'):
    return [None] * len(trained)
  per_model = evaluate_grid(
      trained, runs[0].task, config.eval.grid,
      train_max=bucket_floor(config, config.eval.grid), num_samples=config.eval.grid_samples,
      vocab_size=config.task.vocab_size, eval_seed=config.eval.seed,
      batch_size=config.eval.batch_size, max_position=runs[0].eval_max_position,
      draw=config.positions.draw, clock=clock)
  return [[dict(task=c.task.name, encoding=run_label(c), seed=c.train.seed, **r) for r in rows]
          for c, rows in zip([r.config for r in runs], per_model)]


def _evaluate(trained: list, runs: list, clock: Stopwatch,
              run_dirs: list) -> tuple[list[list[dict]], dict]:
  """Result rows of each trained model (the seeds of one setup: `runs`
  equal but for the seed; each in its `run_dirs` entry) for every evaluation
  variant and length, and the seconds each variant took (generation scoring
  is part of the first); `clock` gets the evaluation and generation stages."""
  run, configs = runs[0], [r.config for r in runs]
  config = run.config
  is_transformer = config.model.kind == 'transformer'
  rows, timings = [[] for _ in trained], {}
  digests = [plan.config_hash(c, identity.extensions(d)) for c, d in zip(configs, run_dirs)]
  for label, scaling in evaluation_variants(run):
    start = time.perf_counter()
    # Generation checks the model's cached decoding path, which RoPE
    # scaling does not change: once per model is enough.
    generate = config.eval.generate and is_transformer and scaling is None
    # The task trained on, then `eval.tasks` (each row under its task's name).
    for task in run.evaluation_tasks:
      with contextlib.ExitStack() as scaled:
        for model in trained:
          scaled.enter_context(rope_scaled(model, scaling))
        per_model = evaluate_models(
            trained, task, run.eval_lengths, train_max=run.bucket_floor,
            num_samples=config.eval.num_samples,
            vocab_size=config.task.vocab_size, eval_seed=config.eval.seed,
            batch_size=config.eval.batch_size, max_position=run.eval_max_position,
            draw=config.positions.draw, generate=generate, clock=clock)
      for model_rows, c, digest, per_length in zip(rows, configs, digests, per_model):
        model_rows += [dict(task=task.name, encoding=label, seed=c.train.seed,
                            config_hash=digest, version=attention_jax.__version__,
                            num_steps=c.train.num_steps, **r)
                       for r in per_length]
    timings[label + (' (with generation)' if generate else '')] = time.perf_counter() - start
  return rows, timings


def run_study(config: ml_collections.ConfigDict, workdir: str,
              log: Callable[[str], None] = print,
              on_trained: Optional[OnTrained] = None) -> list[dict]:
  """The sweep. Writes `results.csv`, `summary.md` and `extrapolation.png`
  into `workdir` and the runs into `workdir/TASK/LABEL/seedN/` (LABEL: the
  study entry, `lab.config.entries`). `on_trained` is called as in `run_one`.

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
    self.runs = plan.plan_study(config, workdir)
    one_study.check(config, workdir, self.runs)  # another study's runs: refused, nothing written
    self.config, self.workdir, self.log = config, workdir, log
    self.tx = shared_optimizer(config.train)  # one object: runs share compilations
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
    group_rows = _train_and_evaluate(
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
