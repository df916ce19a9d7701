"""The study's diagnostics: attention maps and entropy of its trained models.

For every transformer encoding of a study, the first seed's trained model is
restored from the study's workdir (its final checkpoint; nothing is trained
or rewritten: a run that is missing, unfinished or trained with another
config is an error naming it), or the one model of an experiments.train
workdir; then:

* `attention_maps_LABEL.png`: heat maps per layer and head for one copy
  example at L_train and at 4 × L_train;
* `attention_entropy.png`: mean attention entropy vs query position at
  4 × L_train, one line per encoding, with the uniform-attention curve;
* `failures.md` and `failures.csv`: for every seed, at L_train and 2×, 4×,
  8× L_train, how its strings fail (`evaluate.ambiguity`): exact, or the
  first error an ambiguity (a repeated k-gram), an early or a missed EOS, or
  drift; beside the strings' 3- and 4-gram ceilings.

Without a config, the workdir's own is used (`stored_config`), so the study's
encodings, seeds and tasks need not be repeated.
"""

import importlib

import os
from typing import Callable, Optional

import ml_collections
import numpy as np

from attention_jax.lab import evaluate
from attention_jax.lab.config import identity
from attention_jax.lab.config.resolved import ResolvedRun
from attention_jax.lab.config.resolved import resolve
from attention_jax.lab.report import result_files
from attention_jax.lab.report import results
from attention_jax.lab import tasks
from attention_jax.lab.runs import workdirs
from attention_jax.lab.report.plots import plot_attention_maps
from attention_jax.lab.report.plots import plot_entropy
from attention_jax.lab.config.entries import run_label
from attention_jax.lab.runs.plan import check_layout
from attention_jax.lab.runs.plan import place
from attention_jax.lab.runs.plan import run_configs
from attention_jax.lab.train.interrupt import raise_if_stopped
from attention_jax.lab.train.interrupt import stop_requests
from attention_jax.lab.train.loop import load_trained
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.config.validate import checked_run
from attention_jax.lab.config.validate import validate_config


def _trained_run(config: ml_collections.ConfigDict, workdir: str) -> str:
  """The directory of `config`'s finished run in the study `workdir`: its
  run directory, or the sibling a `study.on_mismatch=retrain` sweep trained
  it into. A clear error if there is none."""
  run_dir = os.path.join(workdir, place(config))
  found = identity.find_trained(run_dir, config)
  if found:
    return found
  problem = identity.mismatch(run_dir, config)
  if problem:
    raise identity.RunMismatch(problem, 'pass the config the study was run with.')
  raise ConfigError(f'{run_dir} holds no trained run: run the study on {workdir} with this '
                   'config first (python -m experiments.length_extrapolation).')


def stored_config(workdir: str) -> ml_collections.ConfigDict:
  """The config `workdir` was made with: an experiments.train workdir's
  config.json; for a study, its own config.json if it has one, else the
  newest of its runs' (each run records the whole config, its study section
  included) among those of a plain encoding entry: a variant's (mta_lookup)
  or a part's (NAME:coupled) run records its entry's fields in place of the
  study's (another layer count, step count, positions), and the study's
  other entries are made from the study's fields. Modules in its `imports`
  are imported (a registered encoding)."""
  candidates = [os.path.join(workdir, 'config.json')]
  if workdirs.kind(workdir) == 'study' and not os.path.exists(candidates[0]):
    candidates = sorted(workdirs.run_files(workdir, 'config.json'), key=os.path.getmtime,
                        reverse=True)
  configs = [c for c in (identity.read_config(os.path.dirname(p)) for p in candidates) if c]
  plain = [c for c in configs if not c.model.get('variant') and ':' not in c.model.encoding
           and c.model.get('normalization', 'softmax') == 'softmax']
  for config in plain + configs:  # one of an entry's own fields only if there is no other
    if config is not None:
      for module in config.get('imports', ()):
        importlib.import_module(module)
      return config
  raise ConfigError(f'--workdir={workdir} holds no readable config.json (nor '
                    'TASK/LABEL/seedN/config.json); expected a trained study or run.')


def maps_path(workdir: str, label: str) -> str:
  """Where the attention maps of the entry `label` go."""
  return os.path.join(workdir, f'attention_maps_{label.replace(":", "_")}.png')


def figure_paths(workdir: str, labels) -> list[str]:
  """The figures `run_diagnostics` wrote for the entries `labels`."""
  return [maps_path(workdir, label) for label in labels] + [
      os.path.join(workdir, 'attention_entropy.png')]


def run_diagnostics(config: Optional[ml_collections.ConfigDict], workdir: str, *,
                    num_examples: int = 64,
                    log: Callable[[str], None] = print) -> dict[str, np.ndarray]:
  """Draws the figures into `workdir` (a study's, or one experiments.train
  run's); returns the entropy curves by label. `config` None: the workdir's
  own (`stored_config`). Reads finished runs only: every one is found
  (`_trained_run`) before any figure is drawn."""
  if config is None:
    config = stored_config(workdir)
  if workdirs.kind(workdir) == 'run':
    runs, run_dirs = [checked_run(config)], [workdir]
    if config.model.kind != 'transformer':
      raise ConfigError(f'{workdir} holds a {config.model.kind} model; attention maps are '
                        'drawn for transformers.')
  else:
    validate_config(config, study=True)
    check_layout(workdir)  # an older workdir: told how to move its runs
    runs = [r for r in _study_runs(config) if r.config.train.seed == config.study.seeds[0]
            and r.task.name == config.study.tasks[0]]
    if not runs:
      raise ConfigError(f'{workdir}: study.models={tuple(config.study.models)} has no '
                        'transformer to draw attention maps of.')
    run_dirs = [_trained_run(r.config, workdir) for r in runs]
  seed = runs[0].config.train.seed
  train_max = config.task.train_max_length
  long = min(4 * train_max, config.eval.max_length)
  task = runs[0].task
  train_tokens = tasks.tokens_read(task, train_max)
  curves = {}
  with stop_requests():
    for run, run_dir in zip(runs, run_dirs):
      raise_if_stopped('while drawing the attention maps (nothing to resume: run it again)')
      log(f'{run_label(run.config)}: the model of {run_dir}')  # which run (seedN or a sibling)
      curves[run_label(run.config)] = _draw(run, load_trained(run, run_dir), workdir,
                                            train_max, long, num_examples, log)
    _failures(config, workdir, runs, run_dirs, log)
  plot_entropy(curves, os.path.join(workdir, 'attention_entropy.png'),
               train_tokens=train_tokens,
               title=f'{task.name}: attention entropy at input length {long} '
                     f'(trained on 1–{train_max}), seed {seed}')
  return curves


def _study_runs(config: ml_collections.ConfigDict) -> list[ResolvedRun]:
  """The record of every transformer run of the study `config`, in sweep order."""
  return [resolve(c) for c in run_configs(config) if c.model.kind == 'transformer']


def _failures(config, workdir, runs, run_dirs, log) -> list[dict]:
  """failures.csv and failures.md for every seed of `runs`' encodings (the
  first task's; a study's other seeds are found like the first's)."""
  train_max = config.task.train_max_length
  lengths = [n for n in [train_max] + [m * train_max for m in results.MULTIPLES]
             if n <= config.eval.max_length]
  rows = []
  everyone = [] if workdirs.kind(workdir) == 'run' else _study_runs(config)
  for run, run_dir in zip(runs, run_dirs):
    label = run_label(run.config)
    seeds = [run] if not everyone else [
        s for s in everyone if s.task.name == run.task.name and run_label(s.config) == label]
    for s in seeds:
      raise_if_stopped('while sorting the failures (nothing to resume: run it again)')
      seed = s.config.train.seed
      directory = run_dir if seed == run.config.train.seed else _trained_run(s.config, workdir)
      for row in evaluate.failure_rows(load_trained(s, directory), s, lengths):
        rows.append(dict(task=s.task.name, encoding=label, seed=seed, **row))
  result_files.write_failures(os.path.join(workdir, 'failures.csv'), rows)
  path = os.path.join(workdir, 'failures.md')
  result_files.write_text(path, results.failures_markdown(rows, train_max))
  log(f'failures by kind: {path}')
  return rows


def _draw(run, model, workdir, train_max, long, num_examples, log) -> np.ndarray:
  """One encoding's attention maps (`run`: its record); returns its entropy
  curve at `long`."""
  c, label = run.config, run_label(run.config)
  batches = {n: evaluate.copy_examples(run.task, n, num_examples, vocab_size=c.task.vocab_size,
                                       seed=c.eval.seed, max_position=run.eval_max_position,
                                       draw=c.positions.draw)
             for n in (train_max, long)}
  panels, tokens = [], []
  for n, batch in batches.items():
    weights = evaluate.attention_weights(model, batch)
    panels.append((f'{label}, input length {n}', [w[0] for w in weights]))
    tokens.append(np.asarray(batch['inputs'][0]))
  path = maps_path(workdir, label)
  plot_attention_maps(panels, path, tokens)
  curve = evaluate.entropy_by_position(model, batches[long])
  train_tokens = tasks.tokens_read(run.task, train_max)
  log(f'{label}: {path}; mean entropy past the training length '
      f'{curve[train_tokens:].mean():.2f} nats')
  return curve
