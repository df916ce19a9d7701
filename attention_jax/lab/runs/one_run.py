"""One run, or the seeds of one setup in one program: trained (or resumed;
nothing to do if finished), evaluated at every length, on its hard set
and its grid, and its files written (`run_files`). `run_one` is the
single model of `experiments.train`; the study (`runs.study`) calls
`train_and_evaluate` for each setup of its sweep.

Each run writes into its own folder, which belongs to one trained-model
config (`lab.config.identity`). A run evaluated with the current
evaluation settings is finished and is read back instead of retrained.
"""

import contextlib
import functools
import json
import os
import time
from typing import Callable, Optional

import ml_collections
import optax
from flax import nnx

import attention_jax
from attention_jax.lab.config import identity
from attention_jax.lab.runs import locks
from attention_jax.lab.evaluate import bucket_floor
from attention_jax.lab.evaluate import evaluate_models
from attention_jax.lab.evaluate import hard
from attention_jax.lab.report import hard_report
from attention_jax.lab.evaluate.grid import evaluate_grid
from attention_jax.lab.evaluate import rope_scaled
from attention_jax.lab.evaluate.context_extension import evaluation_variants
from attention_jax.lab.runs import plan
from attention_jax.lab.config.entries import run_label
from attention_jax.lab.runs.run_files import write_run
from attention_jax.lab.runs.timing import Stopwatch
from attention_jax.lab.runs.workdir_checks import refuse_another_kind
from attention_jax.lab.train import make_optimizer
from attention_jax.lab.train import train
from attention_jax.lab.train import train_seeds
from attention_jax.lab.train import divergence
from attention_jax.lab.train.interrupt import raise_if_stopped
from attention_jax.lab.train.interrupt import stage
from attention_jax.lab.train.interrupt import stop_requests
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
    refuse_another_kind(workdir, 'run')  # a study's or the suite's results
    run_dir = identity.resolve(workdir, config)
    if run_dir != workdir and log:
      log(f'{workdir} holds a run of another config; training into {run_dir}')
    deadline = time_budget(config)
    with locks.hold(run_dir, wait=locks.waits(config), log=log or print,
                    should_stop=raise_if_stopped):
      return train_and_evaluate([run], [run_dir], tx, on_trained, log, vmapped=False,
                                 reuse=not reevaluate, deadline=deadline)[0]


def train_and_evaluate(runs, run_dirs, tx, on_trained, log, *, vmapped,
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
