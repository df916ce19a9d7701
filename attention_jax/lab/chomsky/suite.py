"""The benchmark suite: every task × encoding × learning rate of a config,
one record per setting. The seeds of a setting, and the tasks of one padded
shape (`groups`), train together in one program (`trainer.train`: each
model's computation its own, only the matrix products batched), so that the
suite compiles a few programs per encoding, not one per setting.

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

from attention_jax.lab.chomsky import layout
from attention_jax.lab.chomsky import protocol
from attention_jax.lab.chomsky import report
from attention_jax.lab.chomsky import trainer
from attention_jax.lab import results
from attention_jax.lab import tasks
from attention_jax.lab.validate import ConfigError
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
  longest = max([layout.padded_slots(tasks.get_spec(n), e.max_length)
                 for n in config.tasks if n in tasks.SPECS], default=0)
  if not config.tasks:
    raise ConfigError(f'invalid config: tasks is empty; choose from {list(tasks.SPECS)}.')
  for name in config.tasks:
    if name not in tasks.SPECS:
      raise ConfigError(f'invalid config: unknown task {name!r} in tasks; choose from '
                        f'{list(tasks.SPECS)}.')
  if not config.encodings:
    raise ConfigError('invalid config: encodings is empty.')
  for field in ('tasks', 'encodings'):
    names = list(config[field])
    if len(set(names)) != len(names):
      twice = sorted({n for n in names if names.count(n) > 1})
      raise ConfigError(f'invalid config: {field} names {twice} more than once.')
  m_ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
             for v in (m.d_model, m.num_heads, m.mlp_factor, m.noise_max_length))
  if not m_ok or m.d_model % m.num_heads or m.d_model % 2:
    raise ConfigError(f'invalid config: model.d_model={m.d_model!r} must be an even integer '
                      f'that model.num_heads={m.num_heads!r} divides (mlp_factor, '
                      'noise_max_length: integers >= 1).')
  if not 0 <= m.dropout < 1:
    raise ConfigError(f'invalid config: model.dropout={m.dropout!r} must be in [0, 1).')
  for spec in config.encodings:
    check_encoding(spec, config)
  if any(trainer.noise_kind(spec) for spec in config.encodings) and (
      m.noise_max_length < longest):
    raise ConfigError(f'invalid config: model.noise_max_length={m.noise_max_length} is below '
                      f'the longest evaluated sequence, {longest} slots: randomized positions '
                      'are distinct draws from [0, noise_max_length).')
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
  if spec.partition(':')[2] not in ('', 'randomized'):
    raise ConfigError(f'invalid config: encodings has {spec!r}: the encoder protocol takes '
                      f"NAME or NAME:randomized (coupled positions are defined for the "
                      'decoder layout of the copy family and addition).')
  options = dict((config.model.get('encoding_options') or {}).get(name) or {})
  try:
    make_encoding(name, d_model=config.model.d_model, num_heads=config.model.num_heads,
                  max_positions=config.model.noise_max_length, causal=False,
                  rngs=nnx.Rngs(0), **options)
  except ValueError as err:
    raise ConfigError(f'invalid config: encoding {spec!r} cannot run the bidirectional '
                      f'encoder protocol: {err}') from None


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


def groups(config: ml_collections.ConfigDict) -> list[tuple[str, float, list[str]]]:
  """(encoding, learning rate, tasks) trained together: the config's tasks
  of one padded training shape (`layout.padded_slots`), in the config's order."""
  out = []
  for encoding in config.encodings:
    for lr in config.learning_rates:
      by_shape = {}
      for name in config.tasks:
        slots = layout.padded_slots(tasks.get_spec(name), config.train.max_length)
        by_shape.setdefault(slots, []).append(name)
      out += [(encoding, float(lr), names) for names in by_shape.values()]
  return out


def run_group(programs, config, encoding, learning_rate, names, progress) -> list[dict]:
  """Trains and evaluates every task of `names` × seed together -> a record each."""
  group = [tasks.get_spec(n) for n in names]
  begun = time.time()
  graphdef, params, rest, trained_log = trainer.train(programs, group, encoding,
                                                      list(config.seeds), learning_rate,
                                                      progress)
  trained = time.time() - begun
  lengths = trainer.evaluation_lengths(config)
  records = []
  for task, task_params, train_accuracy in zip(group, params,
                                               trained_log['train_accuracy']):
    evaluating = time.time()
    accuracies = trainer.evaluate(programs, task, encoding, graphdef, task_params, rest)
    per_seed = [protocol.run_scores(lengths, a, config.train.max_length) for a in accuracies]
    records.append(dict(
        task=task.name, level=task.level, encoding=encoding, learning_rate=learning_rate,
        seeds=list(config.seeds), lengths=lengths, accuracies=accuracies.tolist(),
        per_seed=per_seed, scores=protocol.setting_scores(per_seed),
        train_accuracy=train_accuracy, trained_with=list(names), log=trained_log['log'],
        seconds=dict(train_group=trained, evaluate=time.time() - evaluating)))
  return records


def run_suite(config: ml_collections.ConfigDict, workdir: str,
              progress: Callable[[str], None] = print) -> list[dict]:
  """Runs every setting not yet recorded, then writes the outputs; returns
  the records, in the config's order of tasks, encodings, learning rates."""
  validate(config)
  check_workdir(config, workdir)
  os.makedirs(workdir, exist_ok=True)
  _write_json(os.path.join(workdir, 'config.json'),
              dict(identity=identity(config), config=config.to_dict()))
  programs = trainer.Programs.for_tasks(config, [tasks.get_spec(t) for t in config.tasks])
  found, begun, done = {}, time.time(), 0
  todo = groups(config)
  total = sum(len(names) for _, _, names in todo)
  for encoding, lr, names in todo:
    for name in names:
      record = load_record(record_path(workdir, name, encoding, lr), progress)
      if record is not None:
        found[(name, encoding, lr)] = record
  if found:
    progress(f'{len(found)} of {total} settings already recorded in {workdir}; running the '
             f'other {total - len(found)}.')
  for i, (encoding, lr, names) in enumerate(todo):
    missing = [name for name in names if (name, encoding, lr) not in found]
    if not missing:
      continue
    progress(f'[group {i + 1}/{len(todo)}] {encoding} (lr {lr:g}) × {", ".join(missing)}; '
             f'seeds {tuple(config.seeds)}')
    for record in run_group(programs, config, encoding, lr, missing, progress):
      _write_json(record_path(workdir, record['task'], encoding, lr), record)
      found[(record['task'], encoding, lr)] = record
      s = record['scores']['score_official']
      progress(f'  {record["task"]} × {encoding}: score {100 * s["max"]:.1f}% (max over '
               f'seeds; mean {100 * s["mean"]:.1f} ± {100 * s["std"]:.1f})')
    done += len(missing)
    left = total - len(found)
    elapsed = time.time() - begun
    progress(f'  {len(found)}/{total} settings; {elapsed / 60:.1f} min so far, about '
             f'{elapsed / done * left / 60:.1f} min left')
  records = [found[(t, e, float(lr))] for t, e, lr in settings(config)]
  report.write_outputs(records, config, workdir)
  return records


def _write_json(path: str, payload) -> None:
  """Written whole or not at all (`results.write_text`)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  results.write_text(path, json.dumps(payload, indent=1))
