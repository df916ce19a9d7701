"""The benchmark suite: every task × encoding × learning rate of a config,
one record per setting. The seeds of a setting, and the tasks of one padded
shape (`groups`), train together in one program (`suite_trainer.train`: each
model's computation its own, only the matrix products batched), so that the
suite compiles a few programs per encoding, not one per setting.

Workdir layout:

  config.json                       the config of the runs (one per workdir)
  settings/TASK/ENCODING/lr_LR.json one setting: per-seed accuracy per length,
                                    scores, the training log, seconds
  groups/ENCODING/lr_LR/TASKS/      a group: its lock (`.lock`), checkpoints
                                    (`checkpoints/STEP`), every compiled
                                    call's loss and accuracy (`metrics.jsonl`,
                                    `tensorboard/` with train.tensorboard)
  results.csv, summary.md, chomsky.png   written once every setting is done

A workdir holds one config's runs: a config whose runs would differ (model,
training, evaluation, seeds) is refused before anything is written, naming
the fields; adding tasks, encodings or learning rates to the same config
extends the workdir, and the fields that only steer a job (checkpoints,
stops, shards, locks, progress) may change between invocations. A rerun
skips the settings already recorded; a damaged record is reported by path,
set aside (`.damaged`) and rerun.

At scale, as the copy study's runs (`lab.runs.study`): a group's training is
checkpointed every `train.checkpoint_every` steps and resumed bit for bit
(an interrupt loses at most that many steps); `train.stop_after` and
`train.max_minutes` stop an invocation cleanly; the groups are dealt between
the jobs of a cluster array (`study.shard`, or SLURM's array variables:
`lab.runs.cluster`), one job at a time per group (`lab.runs.locks`: a group another job
holds is left to it, or with `study.on_locked='wait'` waited for); the
outputs are written by whichever job records the last setting (or by
`study.report_only`). With `study.parallel_setups` > 1 that many groups
train side by side in threads.
"""

import json
import os
import threading
import time
from typing import Callable, Optional

import jax
import ml_collections
import numpy as np
from flax import nnx

from attention_jax.lab.runs import cluster
from attention_jax.lab.evaluate import eval_budget
from attention_jax.lab.runs import runner
from attention_jax.lab.evaluate import suite_hard as hard_set
from attention_jax.lab.protocols import encoder_layout
from attention_jax.lab.protocols import encoder
from attention_jax.lab.report import suite_report
from attention_jax.lab.train import suite_trainer
from attention_jax.lab.report import results
from attention_jax.lab import tasks
from attention_jax.lab.train.interrupt import raise_if_stopped
from attention_jax.lab.errors import ConfigError
from attention_jax.positional import make_encoding
from attention_jax.positional import parse_encoding_spec

# Fields that choose which settings run, or steer a job (checkpoints, stops,
# shards, locks, progress, memory), not what a setting computes.
_NOT_COMPUTED = (('study', 'tasks'), ('study', 'encodings'), ('study', 'learning_rates'),
                 ('study', 'shard'), ('study', 'on_locked'), ('study', 'report_only'),
                 ('study', 'parallel_setups'),
                 ('train', 'log_every'), ('train', 'checkpoint_every'),
                 ('train', 'checkpoint_keep'), ('train', 'stop_after'),
                 ('train', 'max_minutes'), ('train', 'tensorboard'), ('eval', 'cache'))


def identity(config: ml_collections.ConfigDict) -> dict:
  """What every setting of `config` is computed with: the config without
  the fields that only select settings or steer the job."""
  d = config.to_dict()
  for group, key in _NOT_COMPUTED:
    d.get(group, {}).pop(key, None)
  if not d.get('train', {}).get('length_buckets', 1):  # 0 is what older records were
    d['train'].pop('length_buckets')
  return json.loads(json.dumps(d, sort_keys=True, default=list))


def validate(config: ml_collections.ConfigDict) -> None:
  """ConfigError naming the first bad value, before anything runs."""
  t, e, m, study = config.train, config.eval, config.model, config.study
  longest = max([encoder_layout.padded_slots(tasks.get_spec(n), e.max_length)
                 for n in study.tasks if n in tasks.SPECS], default=0)
  if not study.tasks:
    raise ConfigError(f'invalid config: study.tasks is empty; choose from '
                      f'{list(tasks.SPECS)}.')
  for name in study.tasks:
    if name not in tasks.SPECS:
      raise ConfigError(f'invalid config: unknown task {name!r} in study.tasks; choose from '
                        f'{list(tasks.SPECS)}.')
  if not study.encodings:
    raise ConfigError('invalid config: study.encodings is empty.')
  for field in ('tasks', 'encodings'):
    names = list(study[field])
    if len(set(names)) != len(names):
      twice = sorted({n for n in names if names.count(n) > 1})
      raise ConfigError(f'invalid config: study.{field} names {twice} more than once.')
  m_ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
             for v in (m.d_model, m.num_heads, m.mlp_factor, m.noise_max_length))
  if not m_ok or m.d_model % m.num_heads or m.d_model % 2:
    raise ConfigError(f'invalid config: model.d_model={m.d_model!r} must be an even integer '
                      f'that model.num_heads={m.num_heads!r} divides (mlp_factor, '
                      'noise_max_length: integers >= 1).')
  if not 0 <= m.dropout < 1:
    raise ConfigError(f'invalid config: model.dropout={m.dropout!r} must be in [0, 1).')
  if not isinstance(e.get('deterministic', True), bool):
    raise ConfigError(f'invalid config: eval.deterministic={e.deterministic!r} must be True '
                      '(no dropout at evaluation) or False (dropout on, as theirs).')
  for spec in study.encodings:
    check_encoding(spec, config)
  if any(suite_trainer.noise_kind(spec) for spec in study.encodings) and (
      m.noise_max_length < longest):
    raise ConfigError(f'invalid config: model.noise_max_length={m.noise_max_length} is below '
                      f'the longest evaluated sequence, {longest} slots: randomized positions '
                      'are distinct draws from [0, noise_max_length).')
  for field, value in (('train.num_steps', t.num_steps),
                       ('train.steps_per_call', t.steps_per_call),
                       ('train.checkpoint_every', t.checkpoint_every),
                       ('train.checkpoint_keep', t.checkpoint_keep),
                       ('train.batch_size', t.batch_size), ('train.min_length', t.min_length),
                       ('eval.num_samples', e.num_samples), ('eval.batch_size', e.batch_size),
                       ('model.num_layers', m.num_layers), ('train.log_every', t.log_every),
                       ('study.parallel_setups', study.get('parallel_setups', 1))):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConfigError(f'invalid config: {field}={value!r} must be an integer >= 1.')
  for field in ('num_steps', 'checkpoint_every', 'log_every'):
    if t[field] % t.steps_per_call:
      raise ConfigError(f'invalid config: train.{field}={t[field]} must be a multiple of '
                        f'train.steps_per_call={t.steps_per_call} (steps per compiled call).')
  buckets, span = t.get('length_buckets', 0), t.max_length - t.min_length + 1
  if isinstance(buckets, bool) or not isinstance(buckets, int) or not 0 <= buckets <= span:
    raise ConfigError(f'invalid config: train.length_buckets={buckets!r} must be an integer '
                      f'from 0 (none) to {span}, the training lengths '
                      f'train.min_length … train.max_length.')
  stop = t.stop_after
  if isinstance(stop, bool) or not isinstance(stop, int) or stop < 0 or stop % t.steps_per_call:
    raise ConfigError(f'invalid config: train.stop_after={stop!r} must be 0 (never) or a '
                      f'multiple of train.steps_per_call={t.steps_per_call}.')
  if isinstance(t.max_minutes, bool) or not (isinstance(t.max_minutes, (int, float))
                                             and 0 <= t.max_minutes < float('inf')):
    raise ConfigError(f'invalid config: train.max_minutes={t.max_minutes!r} must be a finite '
                      'number >= 0 (0: no limit).')
  if e.num_samples % e.batch_size:
    raise ConfigError(f'invalid config: eval.num_samples={e.num_samples} must be a multiple of '
                      f'eval.batch_size={e.batch_size} (their accuracy averages sub-batches).')
  devices = jax.device_count()
  for field, value in (('train.batch_size', t.batch_size), ('eval.batch_size', e.batch_size)):
    if value % devices:  # each batch is split over the devices (`trainer`: data parallel)
      raise ConfigError(f'invalid config: {field}={value} is not divisible by the {devices} '
                        'devices each batch is split over; use a multiple of the device count.')
  if not t.min_length <= t.max_length:
    raise ConfigError(f'invalid config: train.min_length={t.min_length} > '
                      f'train.max_length={t.max_length}.')
  if not (1 <= e.min_length and e.max_length >= t.max_length + 2):
    raise ConfigError(f'invalid config: eval.max_length={e.max_length} must be >= '
                      f'train.max_length + 2 = {t.max_length + 2} (the official score '
                      'starts at the second test length), eval.min_length >= 1.')
  if not study.seeds or len(set(study.seeds)) != len(study.seeds):
    raise ConfigError(f'invalid config: study.seeds={tuple(study.seeds)!r} must be distinct, '
                      'at least one.')
  if not study.learning_rates or any(not lr > 0 for lr in study.learning_rates):
    raise ConfigError(f'invalid config: study.learning_rates={tuple(study.learning_rates)!r} '
                      'must be positive, at least one.')
  if study.on_locked not in ('refuse', 'wait'):
    raise ConfigError(f"invalid config: study.on_locked={study.on_locked!r}; choose 'refuse' "
                      "or 'wait'.")
  cluster.shard_of(config)
  # An evaluation that cannot fit is refused now, not after every model trained.
  eval_budget.check_encoder(config)


def check_encoding(spec: str, config: ml_collections.ConfigDict) -> None:
  """ConfigError unless `spec` names an encoding that runs bidirectionally
  (built once here with causal=False: a causal-only one says why)."""
  try:
    name, _ = parse_encoding_spec(spec)
    suite_trainer.noise_kind(spec)
  except ValueError as err:
    raise ConfigError(f'invalid config: study.encodings has {spec!r}: {err}') from None
  if spec.partition(':')[2] not in ('', 'randomized'):
    raise ConfigError(f'invalid config: study.encodings has {spec!r}: the encoder protocol takes '
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
  study = config.study
  return [(task, enc, float(lr)) for task in study.tasks for enc in study.encodings
          for lr in study.learning_rates]


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
  of one padded training shape (`encoder_layout.padded_slots`), in the config's order."""
  out = []
  for encoding in config.study.encodings:
    for lr in config.study.learning_rates:
      by_shape = {}
      for name in config.study.tasks:
        slots = encoder_layout.padded_slots(tasks.get_spec(name), config.train.max_length)
        by_shape.setdefault(slots, []).append(name)
      out += [(encoding, float(lr), names) for names in by_shape.values()]
  return out


def group_name(encoding: str, learning_rate: float, names: list[str]) -> str:
  """A group's name, 'ENCODING/lr_LR/TASK+TASK': its folder under
  `groups/`, and what shards deal out."""
  return os.path.join(encoding.replace(':', '+'), f'lr_{learning_rate:g}', '+'.join(names))


def group_dir(workdir: str, encoding: str, learning_rate: float, names: list[str]) -> str:
  """Where a group in training keeps its lock and checkpoints."""
  return os.path.join(workdir, 'groups', group_name(encoding, learning_rate, names))


def run_group(programs, config, encoding, learning_rate, names, progress, *,
              checkpoint_dir=None, deadline=None, metrics_dir=None) -> list[dict]:
  """Trains and evaluates every task of `names` × seed together -> a record
  each (checkpointed in `checkpoint_dir`, if given: `suite_trainer.train`)."""
  group = [tasks.get_spec(n) for n in names]
  seeds = list(config.study.seeds)
  begun = time.time()
  graphdef, params, rest, trained_log = suite_trainer.train(
      programs, group, encoding, seeds, learning_rate, progress,
      checkpoint_dir=checkpoint_dir, deadline=deadline, metrics_dir=metrics_dir)
  trained = time.time() - begun
  lengths = suite_trainer.evaluation_lengths(config)
  records = []
  diverged = np.reshape(np.array(trained_log['diverged_at'], object), (len(group), len(seeds)))
  for task, task_params, train_accuracy, diverged_at in zip(
      group, params, trained_log['train_accuracy'], diverged.tolist()):
    raise_if_stopped(f'before evaluating {task.name} × {encoding} (training checkpointed)')
    evaluating = time.time()
    accuracies = suite_trainer.evaluate(programs, task, encoding, graphdef, task_params, rest)
    hard_rows = hard_set.evaluate(programs, task, encoding, graphdef, task_params, rest)
    per_seed = [encoder.run_scores(lengths, a, config.train.max_length) for a in accuracies]
    records.append(dict(
        task=task.name, level=task.level, encoding=encoding, learning_rate=learning_rate,
        seeds=seeds, lengths=lengths, accuracies=accuracies.tolist(),
        per_seed=per_seed, scores=encoder.setting_scores(per_seed, diverged_at),
        diverged_at=diverged_at, hard=hard_rows,
        train_accuracy=train_accuracy, trained_with=list(names), log=trained_log['log'],
        seconds=dict(train_group=trained, evaluate=time.time() - evaluating)))
  return records


def run_suite(config: ml_collections.ConfigDict, workdir: str,
              progress: Callable[[str], None] = print) -> Optional[list[dict]]:
  """Runs every setting of this job's shard not yet recorded, then, once
  every setting of the config is recorded (by any job), writes the outputs
  and returns the records in the config's order of tasks, encodings,
  learning rates; returns None, after one line saying what is missing, when
  settings of other shards are not recorded yet. Sharding, locks, the stop
  and time checks, groups side by side and the outputs' lock are the
  study's (`runs.runner`)."""
  return runner.run(Suite(config, workdir, progress))


class Suite:
  """DeepMind's suite as a benchmark of `runs.runner`: its jobs are the
  unrecorded tasks of a group (`groups`), its outputs `suite_report`'s."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str,
               log: Callable[[str], None]):
    validate(config)
    check_workdir(config, workdir)
    os.makedirs(workdir, exist_ok=True)
    _write_json(os.path.join(workdir, 'config.json'),
                dict(identity=identity(config), config=config.to_dict()))
    self.config, self.workdir, self.log = config, workdir, log
    self.found = _recorded(config, workdir, log)  # records by setting
    self.lock = threading.Lock()  # the progress count, from groups side by side

  def _missing(self) -> Optional[str]:
    missing = [s for s in settings(self.config) if s not in self.found]
    if not missing:
      return None
    first = os.path.relpath(record_path(self.workdir, *missing[0]), self.workdir)
    return (f'{len(missing)} of {len(settings(self.config))} settings are not recorded yet '
            f'(first: {first})')

  def refuse_unfinished(self) -> None:
    text = self._missing()
    if text:
      raise ConfigError(f'study.report_only: {text}; train them first (the same command '
                        'without study.report_only, or its shards).')

  def jobs(self, index: int, count: int) -> list[runner.Job]:
    """This job's groups (`cluster.shard_runs`: dealt round-robin by name)
    with an unrecorded setting."""
    todo = groups(self.config)
    mine = set(cluster.shard_runs([group_name(*g) for g in todo], index, count))
    if count > 1:
      self.log(f'shard {index} of {count}: {len(mine)} of the {len(todo)} groups')
    self.owned = [(name, encoding, lr) for i, (encoding, lr, group) in enumerate(todo)
                  if i in mine for name in group]
    self.programs = suite_trainer.Programs.for_tasks(
        self.config, [tasks.get_spec(t) for t in self.config.study.tasks])
    self.begun, self.done = time.time(), 0
    out = []
    for i, (encoding, lr, group) in enumerate(todo):
      missing = [name for name in group if (name, encoding, lr) not in self.found]
      if i in mine and missing:
        out.append(runner.Job(
            directories=(group_dir(self.workdir, encoding, lr, missing),),
            prefix=f'[group {i + 1}/{len(todo)}]',
            what=f'{encoding} (lr {lr:g}) × {", ".join(missing)}', work=(encoding, lr, missing)))
    return out

  def run_job(self, job: runner.Job, deadline: Optional[float]) -> None:
    """One group: records made meanwhile by another job are read first (a
    group waited for), then the rest is trained and recorded."""
    encoding, lr, missing = job.work
    for name in missing:
      if (name, encoding, lr) not in self.found:
        record = load_record(record_path(self.workdir, name, encoding, lr), self.log)
        if record is not None:
          self.found[(name, encoding, lr)] = record
    missing = [name for name in missing if (name, encoding, lr) not in self.found]
    if not missing:
      return
    self.log(f'{job.prefix} {encoding} (lr {lr:g}) × {", ".join(missing)}; seeds '
             f'{tuple(self.config.study.seeds)}')
    for record in run_group(self.programs, self.config, encoding, lr, missing, self.log,
                            checkpoint_dir=os.path.join(job.directories[0], 'checkpoints'),
                            metrics_dir=job.directories[0], deadline=deadline):
      _write_json(record_path(self.workdir, record['task'], encoding, lr), record)
      self.found[(record['task'], encoding, lr)] = record
      s = record['scores']['score_official']
      lost = suite_report.diverged_text(record)
      self.log(f'  {record["task"]} × {encoding}: score {100 * s["max"]:.1f}% (max over '
               f'seeds; ' + ('' if record['scores'].get('seeds') == 1 else 'mean ')
               + f"{suite_report.spread(dict(s, seeds=record['scores']['seeds']))})"
               + (f'; {lost}, left out' if lost else ''))
    with self.lock:
      self.done += len(missing)
      elapsed = time.time() - self.begun
      left = sum(1 for setting in self.owned if setting not in self.found)
      self.log(f'  {len(self.found)}/{len(settings(self.config))} settings; '
               f'{elapsed / 60:.1f} min so far, about {elapsed / self.done * left / 60:.1f} '
               'min left')

  def finish(self) -> None:
    pass

  def write_outputs(self) -> Optional[list[dict]]:
    text = self._missing()
    if text:
      self.log(f'{text}: the job that records the last one writes the outputs (or rerun '
               'with --config.study.report_only=True).')
      return None
    records = [self.found[s] for s in settings(self.config)]
    suite_report.write_outputs(records, self.config, self.workdir)
    return records


def _recorded(config, workdir, progress) -> dict:
  """The records of the config's settings found in `workdir`, by setting."""
  found = {}
  for setting in settings(config):
    record = load_record(record_path(workdir, *setting), progress)
    if record is not None:
      found[setting] = record
  if found:
    total = len(settings(config))
    progress(f'{len(found)} of {total} settings already recorded in {workdir}; running the '
             f'other {total - len(found)}.')
  return found


def _write_json(path: str, payload) -> None:
  """Written whole or not at all (`results.write_text`)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  results.write_text(path, json.dumps(payload, indent=1))
