"""Training and evaluation of one setting (task × encoding × learning rate)
under the encoder protocol, every seed at once (`jax.vmap` over seeds).

Training follows their `experiments/training.py`: Adam after clipping the
gradients' global norm, one length per batch drawn uniformly from the
training range (`UniformCurriculum`), dropout on. The seed draws the
parameters and the data, as theirs seeds both. Every batch is a pure
function of `(seed, step)`, made on device `train.steps_per_call` steps at a
time by the task's compiled generator; the compiled train step (a `scan`
over those steps) takes the batches as arrays, so tasks of one padded shape
share it.

The compiled programs (the data generators, the scanned train step, the
evaluation) are `suite_programs.Programs`'s, shared by the settings of one
padded shape.

Because the data need nothing but `(seed, step)`, the whole state of a
group in training is its parameters, the optimizer's state and the log so
far: `train` checkpoints that (`train.checkpoint.Checkpointer`, every
`train.checkpoint_every` steps, and before it stops for a signal,
`train.stop_after` or the time budget), and a group restored from a
checkpoint continues bit for bit as if it had never stopped.

Evaluation follows `experiments/range_evaluation.py`: every length of the
evaluation range, `eval.num_samples` examples in sub-batches of `eval.batch_size`, the
accuracy at a length the mean of the sub-batches' (`protocol`), randomized
positions drawn as in training. Dropout: their model has no train/eval
switch and range_evaluation.py calls it with a random key, so their scores
are measured with dropout on; `eval.deterministic=False` does the same (each
sub-batch's dropout key drawn from `eval.seed` and the length, so a score is
reproducible), True turns it off. Its data come from `eval.seed`
only, so every seed, encoding and learning rate is scored on the same
examples.
"""

import math
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from attention_jax.lab.protocols import encoder_layout
from attention_jax.lab.train.checkpoint import Checkpointer
from attention_jax.lab.train.interrupt import TIME_BUDGET
from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.train.interrupt import stop_signal
from attention_jax.lab.train.loop import out_of_time
from attention_jax.lab.train.metrics import MetricsWriter
from attention_jax.lab.tasks.spec import TaskSpec
from attention_jax.lab.train.suite_programs import Programs
from attention_jax.lab.train.suite_programs import bucket_ends
from attention_jax.lab.train.suite_programs import bucket_slots

def train(programs: Programs, group: list[TaskSpec], encoding: str, seeds: list[int],
          learning_rate: float, progress: Callable[[str], None] = print, *,
          checkpoint_dir: Optional[str] = None, deadline: Optional[float] = None,
          metrics_dir: Optional[str] = None):
  """Trains one model per task of `group` (tasks of one padded shape,
  `encoder_layout.padded_slots`) and seed, all in one program: members task-major,
  `[len(group) · S, …]`. Each member's computation is its own (vmap); only
  the matrix products are batched. Returns (graphdef, params per task, each
  `[S, …]`, rest, a dict: 'log', per compiled call {'step', 'loss',
  'accuracy'}, means over members), and each task's last-call training
  accuracy per seed).

  With `checkpoint_dir`, the group's state (module docstring) is restored
  from the newest checkpoint there, saved every `train.checkpoint_every`
  steps, and saved before a stop: a signal, the step `train.stop_after`, or
  the time `deadline` (a `train.loop` clock time) raise `TrainingInterrupted`
  after the save (exit status 128 + signal, 0, `TIME_BUDGET`).

  With `metrics_dir`, every compiled call's loss and accuracy (the mean, and
  each member's as 'TASK/seedS/loss') go to its `metrics.jsonl`, and with
  `train.tensorboard` to TensorBoard files in its `tensorboard/`
  (`train.metrics.MetricsWriter`: a resumed group drops the lines it redoes)."""
  t = programs.config.train
  if t.num_steps % t.steps_per_call:
    raise ValueError(f'train.num_steps={t.num_steps} must be a multiple of '
                     f'train.steps_per_call={t.steps_per_call}.')
  shapes = {encoder_layout.padded_slots(task, programs.config.task.train_max_length)
            for task in group}
  if len(shapes) != 1:
    raise ValueError(f'tasks {[task.name for task in group]} have different padded shapes '
                     f'{sorted(shapes)}; train them in separate groups.')
  slots = shapes.pop()
  graphdef, params, rest = programs.models(encoding, list(seeds) * len(group))
  widths = (slots,) if not t.get('length_buckets', 0) else bucket_slots(
      group, bucket_ends(programs.config))
  tx, call = programs.train_chunk(graphdef, rest, encoding, learning_rate, widths)
  members, calls = len(seeds) * len(group), t.num_steps // t.steps_per_call
  # Loss and accuracy of every member after every call: the log, kept in the
  # checkpoint so that a resumed group reports what an unbroken one would.
  state = dict(params=params, opt_state=jax.vmap(tx.init)(params),
               loss=np.zeros((calls, members), np.float32),
               accuracy=np.zeros((calls, members), np.float32))
  checkpoints, start = None, 0
  if checkpoint_dir:
    checkpoints = Checkpointer(checkpoint_dir, every=t.checkpoint_every, keep=t.checkpoint_keep)
    state, start = checkpoints.restore_latest(state)
    if start:
      progress(f'    resuming at step {start} from {checkpoint_dir}')
  state['loss'], state['accuracy'] = np.array(state['loss']), np.array(state['accuracy'])
  # On device (restored ones too), replicated on the mesh as the batches
  # (`Programs.train_data`) are.
  state['params'], state['opt_state'] = jax.device_put(
      (state['params'], state['opt_state']), programs.replicated)
  names = [task.name for task in group]
  members_named = [f'{name}/seed{seed}' for name in names for seed in seeds]
  # A row's step is the steps done: a group resumed at step S keeps its rows to S.
  writer = MetricsWriter(metrics_dir, start_step=start and start + 1,
                         tensorboard=t.get('tensorboard', False),
                         config_json=programs.config.to_json_best_effort(indent=1,
                                                                         sort_keys=True))
  seed_array = jnp.asarray(seeds, jnp.int32)
  classes = jnp.repeat(jnp.asarray([task.output_size for task in group], jnp.int32), len(seeds))
  begun = time.time()
  try:
    for begin in range(start, t.num_steps, t.steps_per_call):
      parts = [programs.train_data(task, slots)(seed_array, begin) for task in group]
      batches = jax.tree.map(lambda *a: jnp.concatenate(a), *parts)
      batches['num_classes'] = jnp.broadcast_to(classes[:, None, None],
                                                (members, t.steps_per_call, 1))
      buckets = batches.pop('bucket')[0]  # every member's (module docstring)
      state['params'], state['opt_state'], loss, acc = call(state['params'],
                                                            state['opt_state'], batches, buckets)
      done, i = begin + t.steps_per_call, begin // t.steps_per_call
      state['loss'][i], state['accuracy'][i] = np.asarray(loss), np.asarray(acc)
      row = dict(step=done, loss=float(np.mean(state['loss'][i])),
                 accuracy=float(np.mean(state['accuracy'][i])))
      for name, member_loss, member_acc in zip(members_named, state['loss'][i],
                                               state['accuracy'][i]):
        row.update({f'{name}/loss': float(member_loss), f'{name}/accuracy': float(member_acc)})
      writer.write(row)
      writer.flush()  # before a checkpoint can cover this step
      if done % t.log_every == 0 or done == t.num_steps:
        progress(f'    step {done}/{t.num_steps}: loss {float(jnp.mean(loss)):.3f}, train '
                 f'accuracy {float(jnp.mean(acc)):.3f} ({time.time() - begun:.0f}s)')
      _save_or_stop(checkpoints, state, done, t, deadline, f'{names} × {encoding}')
      if not np.isfinite(state['loss'][:i + 1]).all(axis=0).any():
        progress(f'    step {done}: every member diverged (non-finite loss); stopped')
        break  # nothing left to train: the checkpoints so far are kept
  finally:
    writer.close()
    if checkpoints is not None:
      checkpoints.close()
  s = len(seeds)
  per_task = [jax.tree.map(lambda a, i=i: a[i * s:(i + 1) * s], state['params'])
              for i in range(len(group))]
  log = [dict(step=(i + 1) * t.steps_per_call, loss=float(jnp.mean(state['loss'][i])),
              accuracy=float(jnp.mean(state['accuracy'][i]))) for i in range(calls)]
  # Each task's training accuracy over its last call (dropout on), per seed.
  last = state['accuracy'][-1].reshape(len(group), s)
  return graphdef, per_task, rest, dict(log=log, train_accuracy=last.tolist(),
                                        diverged_at=diverged_steps(state['loss'], t))


def diverged_steps(loss: np.ndarray, t: ml_collections.ConfigDict) -> list:
  """Per member (task-major, as `train` lays them out): None, or the step
  that ends the first compiled call whose mean loss is NaN or infinite (the
  loss is read after every call; the log holds it, so a resumed group
  finds the same). A diverged member trains on inside the program (vmap
  keeps members apart) until every member has diverged; its scores are left
  out of the setting's (`encoder.setting_scores`)."""
  bad = ~np.isfinite(loss)
  return [int((np.argmax(bad[:, m]) + 1) * t.steps_per_call) if bad[:, m].any() else None
          for m in range(loss.shape[1])]


def _save_or_stop(checkpoints: Optional[Checkpointer], state: dict, done: int,
                  t: ml_collections.ConfigDict, deadline: Optional[float], what: str) -> None:
  """Saves the state after `done` steps when due; on a stop (signal,
  `train.stop_after`, the time budget) saves it and raises
  `TrainingInterrupted` saying what was kept."""
  signum, timed_out = stop_signal(), out_of_time(deadline)
  stopping = signum or done == t.stop_after or timed_out
  if checkpoints is not None:
    checkpoints.maybe_save(done, state, force=bool(stopping) and done < t.num_steps)
  if not stopping or done == t.num_steps:
    return
  kept = (f'checkpointed at step {done} in {checkpoints.directory}'
          if checkpoints is not None else 'not checkpointed: that group is rerun')
  why = (f'signal {signum}' if signum else
         f'train.max_minutes={t.max_minutes:g} (this invocation\'s time budget)' if timed_out
         else 'train.stop_after')
  status = (TIME_BUDGET,) if timed_out and not signum else ()
  raise TrainingInterrupted(f'stopped by {why} at step {done} of {what} ({kept}); run the same '
                            'command again to resume.', signum, *status)


def evaluation_lengths(config: ml_collections.ConfigDict) -> list[int]:
  """The lengths evaluated: eval.min_length … eval.max_length."""
  return list(range(config.eval.min_length, config.eval.max_length + 1))


def evaluate(programs: Programs, task: TaskSpec, encoding: str, graphdef, params,
             rest) -> np.ndarray:
  """Accuracy per seed and length, float `[S, len(evaluation_lengths)]`.
  Lengths are padded to buckets of `eval.bucket` symbols (one compiled
  program per bucket; 0: one bucket, the longest length)."""
  e = programs.config.eval
  bucket = e.bucket or e.max_length
  columns = []
  for n in evaluation_lengths(programs.config):
    padded = min(e.max_length, bucket * math.ceil(n / bucket))
    slots = encoder_layout.padded_slots(task, padded)
    batches = programs.eval_batches(task, n, slots, padded)
    accuracy = programs.eval_accuracy(graphdef, rest, encoding, slots)(params, batches)
    columns.append(np.asarray(accuracy))
  return np.stack(columns, axis=1)
