"""The benchmark suite: every task × encoding × learning rate of a config,
all seeds of a setting trained together (`trainer`), one record per setting.

Workdir layout:

  config.json                       the config of the runs (one per workdir)
  settings/TASK/ENCODING/lr_LR.json one setting: per-seed accuracy per length,
                                    scores, the training log, seconds
  results.csv, summary.md, chomsky.png   written once every setting is done

A workdir holds one config's runs: a config whose runs would differ (model,
training, evaluation, seeds) is refused before anything is written, naming
the fields; adding tasks, encodings or learning rates to the same config
extends the workdir. A rerun skips the settings already recorded; a damaged
record is reported by path, set aside (`.damaged`) and rerun. An interrupt
loses only the setting in progress.
"""

import json
import os
import time
from typing import Callable

import ml_collections
import numpy as np
from flax import nnx

from attention_jax.lab.chomsky import protocol
from attention_jax.lab.chomsky import report
from attention_jax.lab.chomsky import trainer
from attention_jax.lab.tasks.chomsky import registry as tasks
from attention_jax.lab.validate import ConfigError
from attention_jax.positional import ENCODINGS
from attention_jax.positional import make_encoding
from attention_jax.positional import parse_encoding_spec

# Fields that choose which settings run, not what a setting computes.
_SELECTION = ('tasks', 'encodings', 'learning_rates')
_PROGRESS_ONLY = (('train', 'log_every'),)


def identity(config: ml_collections.ConfigDict) -> dict:
  """What every setting of `config` is computed with: the config without
  the fields that only select settings or report progress."""
  d = config.to_dict()
  for key in _SELECTION:
    d.pop(key, None)
  for group, key in _PROGRESS_ONLY:
    d.get(group, {}).pop(key, None)
  return json.loads(json.dumps(d, sort_keys=True, default=list))


def validate(config: ml_collections.ConfigDict) -> None:
  """ConfigError naming the first bad value, before anything runs."""
  t, e, m = config.train, config.eval, config.model
  if not config.tasks:
    raise ConfigError(f'invalid config: tasks is empty; choose from {list(tasks.TASKS)}.')
  for name in config.tasks:
    if name not in tasks.TASKS:
      raise ConfigError(f'invalid config: unknown task {name!r} in tasks; choose from '
                        f'{list(tasks.TASKS)}.')
  if not config.encodings:
    raise ConfigError('invalid config: encodings is empty.')
  for spec in config.encodings:
    check_encoding(spec, config)
  for field, value in (('train.steps', t.steps), ('train.chunk', t.chunk),
                       ('train.batch_size', t.batch_size), ('train.min_length', t.min_length),
                       ('eval.samples', e.samples), ('eval.sub_batch', e.sub_batch),
                       ('model.num_layers', m.num_layers), ('train.log_every', t.log_every)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConfigError(f'invalid config: {field}={value!r} must be an integer >= 1.')
  if t.steps % t.chunk:
    raise ConfigError(f'invalid config: train.steps={t.steps} must be a multiple of '
                      f'train.chunk={t.chunk}.')
  if e.samples % e.sub_batch:
    raise ConfigError(f'invalid config: eval.samples={e.samples} must be a multiple of '
                      f'eval.sub_batch={e.sub_batch} (their accuracy averages sub-batches).')
  if not t.min_length <= t.max_length:
    raise ConfigError(f'invalid config: train.min_length={t.min_length} > '
                      f'train.max_length={t.max_length}.')
  if not (1 <= e.min_length and e.max_length >= t.max_length + 2):
    raise ConfigError(f'invalid config: eval.max_length={e.max_length} must be >= '
                      f'train.max_length + 2 = {t.max_length + 2} (the official score '
                      'starts at the second test length), eval.min_length >= 1.')
  if not config.seeds or len(set(config.seeds)) != len(config.seeds):
    raise ConfigError(f'invalid config: seeds={tuple(config.seeds)!r} must be distinct, '
                      'at least one.')
  if not config.learning_rates or any(not lr > 0 for lr in config.learning_rates):
    raise ConfigError(f'invalid config: learning_rates={tuple(config.learning_rates)!r} '
                      'must be positive, at least one.')


def check_encoding(spec: str, config: ml_collections.ConfigDict) -> None:
  """ConfigError unless `spec` names an encoding that runs bidirectionally
  (built once here with causal=False: a causal-only one says why)."""
  try:
    name, _ = parse_encoding_spec(spec)
    trainer.noise_kind(spec)
  except ValueError as err:
    raise ConfigError(f'invalid config: encodings has {spec!r}: {err}') from None
  options = dict((config.model.get('encoding_options') or {}).get(name) or {})
  try:
    make_encoding(name, d_model=config.model.d_model, num_heads=config.model.num_heads,
                  max_positions=config.model.noise_max_length, causal=False,
                  rngs=nnx.Rngs(0), **options)
  except ValueError as err:
    raise ConfigError(f'invalid config: encoding {spec!r} cannot run the bidirectional '
                      f'encoder protocol: {err}') from None
  assert name in ENCODINGS


def settings(config: ml_collections.ConfigDict) -> list[tuple[str, str, float]]:
  """(task, encoding, learning rate) of every setting, tasks outermost."""
  return [(task, enc, float(lr)) for task in config.tasks for enc in config.encodings
          for lr in config.learning_rates]


def record_path(workdir: str, task: str, encoding: str, learning_rate: float) -> str:
  return os.path.join(workdir, 'settings', task, encoding.replace(':', '+'),
                      f'lr_{learning_rate:g}.json')


def check_workdir(config: ml_collections.ConfigDict, workdir: str) -> None:
  """ConfigError if `workdir` holds runs of another config (names the fields)."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    return
  try:
    with open(path) as f:
      stored = json.load(f)['identity']
  except (OSError, ValueError, KeyError) as err:
    raise ConfigError(f'{path} is damaged ({err}); move it away or use another '
                      '--workdir.') from None
  mine = identity(config)
  if stored != mine:
    fields = sorted(_differences(stored, mine))
    raise ConfigError(f'--workdir={workdir} holds runs of another config (differing: '
                      f'{", ".join(fields)}); use a new --workdir for this one.')


def _differences(a, b, prefix=''):
  if isinstance(a, dict) and isinstance(b, dict):
    for key in set(a) | set(b):
      yield from _differences(a.get(key), b.get(key), f'{prefix}{key}.')
  elif a != b:
    yield prefix.rstrip('.')


def load_record(path: str, progress: Callable[[str], None]):
  """The record at `path`, or None when absent or damaged (reported, set aside)."""
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      record = json.load(f)
    np.asarray(record['accuracies'], np.float64)
    return record
  except (OSError, ValueError, KeyError) as err:
    os.replace(path, path + '.damaged')
    progress(f'  {path} is damaged ({err}); set aside as {path}.damaged, rerunning.')
    return None


def run_setting(programs, config, task_name, encoding, learning_rate, progress) -> dict:
  """Trains and evaluates every seed of one setting -> its record."""
  task = tasks.get_task(task_name)
  begun = time.time()
  graphdef, params, rest, log = trainer.train(programs, task, encoding, list(config.seeds),
                                              learning_rate, progress)
  trained = time.time() - begun
  accuracies = trainer.evaluate(programs, task, encoding, graphdef, params, rest)
  lengths = trainer.evaluation_lengths(config)
  per_seed = [protocol.run_scores(lengths, a, config.train.max_length) for a in accuracies]
  return dict(task=task_name, level=task.level, encoding=encoding,
              learning_rate=learning_rate, seeds=list(config.seeds), lengths=lengths,
              accuracies=accuracies.tolist(), per_seed=per_seed,
              scores=protocol.setting_scores(per_seed), log=log,
              seconds=dict(train=trained, evaluate=time.time() - begun - trained))


def run_suite(config: ml_collections.ConfigDict, workdir: str,
              progress: Callable[[str], None] = print) -> list[dict]:
  """Runs every setting not yet recorded, then writes the outputs; returns
  the records."""
  validate(config)
  check_workdir(config, workdir)
  os.makedirs(workdir, exist_ok=True)
  _write_json(os.path.join(workdir, 'config.json'),
              dict(identity=identity(config), config=config.to_dict()))
  todo = settings(config)
  chosen = [tasks.get_task(t) for t in config.tasks]
  programs = trainer.Programs(config, *trainer.sizes(chosen))
  records, begun, ran = [], time.time(), 0
  for i, (task, encoding, lr) in enumerate(todo):
    path = record_path(workdir, task, encoding, lr)
    record = load_record(path, progress)
    if record is None:
      progress(f'[{i + 1}/{len(todo)}] {task} × {encoding} (lr {lr:g}, seeds '
               f'{tuple(config.seeds)})')
      record = run_setting(programs, config, task, encoding, lr, progress)
      _write_json(path, record)
      ran += 1
      elapsed = time.time() - begun
      left = len(todo) - i - 1
      s = record['scores']['score_official']
      progress(f'  score {100 * s["max"]:.1f}% (max over seeds; mean {100 * s["mean"]:.1f} ± '
               f'{100 * s["std"]:.1f}); {elapsed / 60:.1f} min so far, about '
               f'{elapsed / ran * left / 60:.1f} min left')
    records.append(record)
  report.write_outputs(records, config, workdir)
  return records


def _write_json(path: str, payload) -> None:
  """Written whole or not at all (a temporary file, then a rename)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + '.tmp', 'w') as f:
    json.dump(payload, f, indent=1)
  os.replace(path + '.tmp', path)
