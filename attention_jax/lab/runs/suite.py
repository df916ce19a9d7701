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

import ml_collections
import numpy as np

from attention_jax.lab.runs import cluster
from attention_jax.lab.config.suite_config import check_workdir
from attention_jax.lab.config.suite_config import identity
from attention_jax.lab.config.suite_config import validate
from attention_jax.lab.runs import runner
from attention_jax.lab.runs.workdir_checks import refuse_another_kind
from attention_jax.lab.evaluate import suite_hard as hard_set
from attention_jax.lab.protocols import encoder_layout
from attention_jax.lab.protocols import encoder
from attention_jax.lab.report import suite_report
from attention_jax.lab.train import suite_programs
from attention_jax.lab.train import suite_trainer
from attention_jax.lab.report import result_files
from attention_jax.lab import tasks
from attention_jax.lab.train.interrupt import raise_if_stopped
from attention_jax.lab.errors import ConfigError

def settings(config: ml_collections.ConfigDict) -> list[tuple[str, str, float]]:
  """(task, encoding, learning rate) of every setting, tasks outermost."""
  study = config.study
  return [(task, enc, float(lr)) for task in study.tasks for enc in study.encodings
          for lr in study.learning_rates]


def record_path(workdir: str, task: str, encoding: str, learning_rate: float) -> str:
  return os.path.join(workdir, 'settings', task, encoding.replace(':', '+'),
                      f'lr_{learning_rate:g}.json')


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
        slots = encoder_layout.padded_slots(tasks.get_spec(name), config.task.train_max_length)
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
    per_seed = [encoder.run_scores(lengths, a, config.task.train_max_length)
                for a in accuracies]
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
  runner's (`runs.runner`), as for the decoder study."""
  return runner.run(Suite(config, workdir, progress))


class Suite:
  """DeepMind's suite as a benchmark of `runs.runner`: its jobs are the
  unrecorded tasks of a group (`groups`), its outputs `suite_report`'s."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str,
               log: Callable[[str], None]):
    validate(config)
    refuse_another_kind(workdir, 'suite')  # a decoder study's or one run's
    check_workdir(config, workdir)
    self.config, self.workdir, self.log = config, workdir, log
    self.found = {}  # records by setting
    self._read(settings(config))
    if self.found:
      total = len(settings(config))
      log(f'{len(self.found)} of {total} settings already recorded in {workdir}; running the '
          f'other {total - len(self.found)}.')
    self.lock = threading.Lock()  # the progress count, from groups side by side

  def _read(self, wanted) -> None:
    """Adds to `found` the records of `wanted` settings not yet in it that
    are on disk now (another job of the array may have recorded them)."""
    for setting in wanted:
      if setting not in self.found:
        record = load_record(record_path(self.workdir, *setting), self.log)
        if record is not None:
          self.found[setting] = record

  def _missing(self) -> Optional[str]:
    self._read(settings(self.config))
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
    with an unrecorded setting; the workdir's config.json written first."""
    os.makedirs(self.workdir, exist_ok=True)
    _write_json(os.path.join(self.workdir, 'config.json'),
                dict(identity=identity(self.config), config=self.config.to_dict()))
    todo = groups(self.config)
    mine = set(cluster.shard_runs([group_name(*g) for g in todo], index, count))
    if count > 1:
      self.log(f'shard {index} of {count}: {len(mine)} of the {len(todo)} groups')
    self.owned = [(name, encoding, lr) for i, (encoding, lr, group) in enumerate(todo)
                  if i in mine for name in group]
    self.programs = suite_programs.Programs.for_tasks(
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
    self._read([(name, encoding, lr) for name in missing])
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


def _write_json(path: str, payload) -> None:
  """Written whole or not at all (`result_files.write_text`)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  result_files.write_text(path, json.dumps(payload, indent=1))
