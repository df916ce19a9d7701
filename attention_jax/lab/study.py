"""One run (train, then evaluate every length) and the sweep over
tasks × encodings × seeds, with the study's outputs.

Each run writes into its own folder; a run whose `results.csv` exists is
finished and is read back instead of retrained, so an interrupted sweep picks
up at the first unfinished run when the same command is run again.
"""

import hashlib
import json
import os
import time
from typing import Callable, Optional

import ml_collections
import optax
from flax import nnx

import attention_jax
from attention_jax.lab import results
from attention_jax.lab import tasks
from attention_jax.lab.evaluate import default_eval_lengths
from attention_jax.lab.evaluate import evaluate_lengths
from attention_jax.lab.evaluate import rope_scaled
from attention_jax.lab import models
from attention_jax.positional import RopeScaling
from attention_jax.lab.plots import plot_extrapolation
from attention_jax.lab.train import make_optimizer
from attention_jax.lab.train import train
from attention_jax.lab.validate import validate_config


OnTrained = Callable[[nnx.Module, ml_collections.ConfigDict, str], None]


def eval_lengths(config: ml_collections.ConfigDict) -> list[int]:
  return sorted(config.eval.lengths) or default_eval_lengths(
      config.task.train_max_length, config.eval.max_length)


def run_one(config: ml_collections.ConfigDict, workdir: str,
            tx: Optional[optax.GradientTransformation] = None,
            on_trained: Optional[OnTrained] = None) -> list[dict]:
  """Trains one model and evaluates it at every length.

  `on_trained(model, config, workdir)`, if given, is called with the trained
  model (to draw a figure from it, say) before evaluation.

  Writes `metrics.jsonl` (every training step), `results.csv` (one row per
  length, written last: its presence marks the run finished) and `run.json`
  (timings and final training metrics) into `workdir`. Returns the rows.
  """
  validate_config(config)
  os.makedirs(workdir, exist_ok=True)
  start = time.perf_counter()
  model, last = train(config, workdir, progress=config.progress, tx=tx)
  train_seconds = time.perf_counter() - start
  if on_trained:
    on_trained(model, config, workdir)
  start = time.perf_counter()
  is_transformer = config.model.kind == 'transformer'
  max_position = (models.randomized_max_position(config)
                  if config.positions.randomized_eval == 'random' else 0)
  rows = []
  for label, scaling in evaluation_variants(config):
    with rope_scaled(model, scaling):
      per_length = evaluate_lengths(
          model, tasks.get_task(config.task.name), eval_lengths(config),
          train_max=config.task.train_max_length, num_samples=config.eval.num_samples,
          vocab_size=config.task.vocab_size, eval_seed=config.eval.seed,
          batch_size=config.eval.batch_size, max_position=max_position,
          # Generation checks the model's cached decoding path, which RoPE
          # scaling does not change: once per model is enough.
          generate=config.eval.generate and is_transformer and scaling is None)
    rows += [dict(task=config.task.name, encoding=label, seed=config.train.seed,
                  config_hash=config_hash(config), version=attention_jax.__version__,
                  **r) for r in per_length]
  eval_seconds = time.perf_counter() - start
  with open(os.path.join(workdir, 'run.json'), 'w') as f:
    json.dump(dict(train_seconds=train_seconds, eval_seconds=eval_seconds,
                   final_train_metrics=last, config=config.to_dict()), f, indent=1)
  results.write_rows(os.path.join(workdir, 'results.csv'), rows)
  return rows


# Fields that change how a run is executed or logged, not what it computes.
_NOT_HASHED = {'progress': None, 'study': None, 'distributed': None,
               'train': ('seed', 'stop_after', 'log_every', 'checkpoint_every',
                         'checkpoint_keep', 'tensorboard')}


def config_hash(config: ml_collections.ConfigDict) -> str:
  """12 hex digits identifying what a run computes: equal for two seeds of one
  setup, different when any hyperparameter, the task or the encoding differ."""
  d = config.to_dict()
  for key, fields in _NOT_HASHED.items():
    if fields is None:
      d.pop(key, None)
    else:
      for field in fields:
        d[key].pop(field, None)
  text = json.dumps(d, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def run_label(config: ml_collections.ConfigDict) -> str:
  """What results.csv's `encoding` column says: the encoding of a transformer
  (`NAME:randomized` with randomized positions), the model kind ('seq2seq',
  'seq2seq_attention') of anything else."""
  if config.model.kind != 'transformer':
    return config.model.kind
  return config.model.encoding


def evaluation_variants(config: ml_collections.ConfigDict) -> list[tuple[str, Optional[RopeScaling]]]:
  """(label, RoPE scaling) per evaluation of a trained model: the model as
  trained, then, for plain 'rope' models, each of `config.eval.rope_scalings`
  (label 'rope+METHOD'), with factor `config.eval.rope_scale_factor` (0: longest
  evaluated / longest training sequence) and L the longest training sequence."""
  variants = [(run_label(config), None)]
  if config.model.kind == 'transformer' and config.model.encoding == 'rope':
    train_tokens = tasks.tokens_read(tasks.get_task(config.task.name),
                                     config.task.train_max_length)
    factor = config.eval.rope_scale_factor or models.longest_sequence(config) / train_tokens
    for method in config.eval.rope_scalings:
      variants.append((f'rope+{method}', RopeScaling(method, factor, train_tokens)))
  return variants


def run_configs(config: ml_collections.ConfigDict) -> list[ml_collections.ConfigDict]:
  """One config per run of the sweep: tasks × (transformer encodings, other
  model kinds) × seeds."""
  runs = []
  for task in config.study.tasks:
    for kind in config.study.models:
      encodings = config.study.encodings if kind == 'transformer' else ('none',)
      for spec in encodings:
        for seed in config.study.seeds:
          c = ml_collections.ConfigDict(config.to_dict())
          c.task.name, c.model.kind, c.model.encoding, c.train.seed = (
              task, kind, spec, seed)
          runs.append(c)
  return runs


def run_directory(workdir: str, config: ml_collections.ConfigDict) -> str:
  """Where the study keeps one run: `workdir/runs/TASK/LABEL/seedN`."""
  return os.path.join(workdir, 'runs', config.task.name, run_label(config),
                      f'seed{config.train.seed}')


def run_study(config: ml_collections.ConfigDict, workdir: str,
              log: Callable[[str], None] = print,
              on_trained: Optional[OnTrained] = None) -> list[dict]:
  """The sweep. Writes `results.csv`, `summary.md` and `extrapolation.png`
  into `workdir` and the runs into `workdir/runs/TASK/LABEL/seedN/` (LABEL:
  see `run_label`). `on_trained` is passed to every `run_one`."""
  validate_config(config, study=True)
  runs = run_configs(config)
  for c in runs:  # every run's config, checked before anything compiles
    validate_config(c)
  os.makedirs(workdir, exist_ok=True)
  rows, start = [], time.perf_counter()
  tx = make_optimizer(config.train)  # one object: runs share compilations
  for i, c in enumerate(runs, 1):
    name = f'{c.task.name} {run_label(c)} seed {c.train.seed}'
    run_dir = run_directory(workdir, c)
    done = os.path.join(run_dir, 'results.csv')
    if os.path.exists(done):
      rows += results.read_rows(done)
      log(f'[{i}/{len(runs)}] {name}: finished earlier, reused')
      continue
    run_rows = run_one(c, run_dir, tx, on_trained)
    rows += run_rows
    with open(os.path.join(run_dir, 'run.json')) as f:
      info = json.load(f)
    own = [r for r in run_rows if r['encoding'] == run_label(c)]  # not rope+…
    in_range = [r['token_accuracy'] for r in own
                if r['length'] <= config.task.train_max_length]
    log(f'[{i}/{len(runs)}] {name}: '
        f"train {info['train_seconds']:.0f}s, eval {info['eval_seconds']:.0f}s, "
        f'token accuracy in training range {100 * sum(in_range) / len(in_range):.1f}%, '
        f"at {own[-1]['length']}: {100 * own[-1]['token_accuracy']:.1f}% "
        f'({time.perf_counter() - start:.0f}s so far)')
  write_study_outputs(rows, workdir, config)
  return rows


def write_study_outputs(rows, workdir: str, config: ml_collections.ConfigDict) -> None:
  t = config.task
  results.write_rows(os.path.join(workdir, 'results.csv'), rows)
  with open(os.path.join(workdir, 'summary.md'), 'w') as f:
    f.write(results.summary_markdown(rows, t.train_min_length, t.train_max_length))
  plot_extrapolation(rows, os.path.join(workdir, 'extrapolation.png'),
                     train_min=t.train_min_length, train_max=t.train_max_length)
