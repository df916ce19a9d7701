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

Because the data need nothing but `(seed, step)`, the whole state of a
group in training is its parameters, the optimizer's state and the log so
far: `train` checkpoints that (`train.checkpoint.Checkpointer`, every
`train.checkpoint_every` steps, and before it stops for a signal,
`train.stop_after` or the time budget), and a group restored from a
checkpoint continues bit for bit as if it had never stopped.

Length buckets (`train.length_buckets` = K > 0): every batch is padded to
the longest training length, so a short batch pays for the longest; with K
buckets each step runs at the slots of its length's bucket instead (the
training lengths split into K equal ranges), one branch per bucket in the
compiled step (`lax.switch`). A switch picks one branch only when every
member of the program takes it, so the step's length is then drawn once
for the whole run, from `(LENGTH_SEED, step)`, where K = 0 draws one per
seed as theirs. The padding is inert (keys past a batch's length are
masked; randomized positions are the same first draws), so the buckets
change the cost of a step, not its result (to float rounding, with dropout
off: dropout masks are drawn over the padded shape).

Shared shapes: every task is laid out with the suite's common vocabulary
(the largest `input_size` + 1) and class count, its own classes marked by
`num_classes`: the head's other logits are masked out (a finite large
negative), so they get no gradient and Adam never moves them, and the
embedding rows of symbols a task never uses are never read. The model is
then the official one for that task, with a few inert parameters, and one
compiled program serves every task of a shape (`encoder_layout.padded_slots`).

Devices: data parallel over every device, as the study trains (`train.mesh`
'data'): the state replicated on a 1-D mesh 'data', each batch split along
its rows (training and evaluation alike; the batch sizes must be multiples
of the device count). One device is the same code with a mesh of one.

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
import threading
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from attention_jax.lab.protocols import encoder_layout
from attention_jax.lab.protocols import encoder
from attention_jax.lab.train.checkpoint import Checkpointer
from attention_jax.lab.train.interrupt import TIME_BUDGET
from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.train.interrupt import stop_signal
from attention_jax.lab.train.loop import out_of_time
from attention_jax.lab.train.metrics import MetricsWriter
from attention_jax.lab.train.mesh import make as make_mesh
from attention_jax.lab.tasks.spec import TaskSpec
from attention_jax.nn.encoder import TransformerEncoder
from attention_jax.positional import parse_encoding_spec

def noise_kind(encoding: str) -> Optional[str]:
  """How 'NAME:randomized' draws (`encoder_layout.NOISE_KINDS`); None when not
  randomized. A ValueError names an encoding their code does not randomize."""
  name, randomized = parse_encoding_spec(encoding)
  if not randomized:
    return None
  if name not in encoder_layout.NOISE_KINDS:
    raise ValueError(f'encoding {encoding!r}: the encoder protocol randomizes positions as '
                     f"DeepMind's code does, which it defines for {sorted(encoder_layout.NOISE_KINDS)}.")
  return encoder_layout.NOISE_KINDS[name]


# The key of the run's shared training lengths under `train.length_buckets`.
LENGTH_SEED = 0x1e9


def bucket_ends(config: ml_collections.ConfigDict) -> list[int]:
  """The longest training length of each bucket (module docstring):
  `train.length_buckets` equal ranges of min_length … max_length; [max_length]
  for 0."""
  t = config.train
  count = t.get('length_buckets', 0)
  if not count:
    return [t.max_length]
  span = t.max_length - t.min_length + 1
  return sorted({t.min_length - 1 + math.ceil(span * (j + 1) / count) for j in range(count)})


def bucket_slots(group: list[TaskSpec], ends: list[int]) -> tuple[int, ...]:
  """The slots each bucket's batches need: the most tokens any task of
  `group` fills at a length up to the bucket's end."""
  need = lambda n: max(t.input_length(n) + t.output_length(n) for t in group)
  return tuple(max(need(n) for n in range(1, end + 1)) for end in ends)


def sizes(tasks: list[TaskSpec], max_length: int) -> tuple[int, int, int]:
  """(vocabulary, classes, positions) shared by `tasks`: the largest
  input_size + 1 (the blank), the largest output_size (module docstring),
  and the most slots any of them fills at `max_length`."""
  return (max(t.input_size for t in tasks) + 1, max(t.output_size for t in tasks),
          max(encoder_layout.padded_slots(t, max_length) for t in tasks))


def build_model(encoding: str, config: ml_collections.ConfigDict, seed: int, *,
                vocab_size: int, num_classes: int, slots: int) -> TransformerEncoder:
  """The encoder of `config.model` for `slots` tokens at most."""
  m = config.model
  name = parse_encoding_spec(encoding)[0]
  groups = m.get('encoding_options') or {}
  options = dict(groups.get(name) or {})
  return TransformerEncoder(
      vocab_size=vocab_size, output_size=num_classes, d_model=m.d_model,
      num_heads=m.num_heads, num_layers=m.num_layers, mlp_dim=m.mlp_factor * m.d_model,
      encoding=name, max_positions=m.noise_max_length if noise_kind(encoding) else slots,
      encoding_options=options, dropout_rate=m.dropout, rngs=nnx.Rngs(params=seed))


def _masked_logits(logits, num_classes):
  """The head's logits with classes >= num_classes (another task's) masked."""
  keep = jnp.arange(logits.shape[-1]) < num_classes
  return jnp.where(keep, logits, -1e9)


class Programs:
  """The compiled programs of one suite run, keyed by what shapes them, so
  that settings of one shape share them (no global state: one per run)."""

  def __init__(self, config: ml_collections.ConfigDict, vocab_size: int, num_classes: int,
               max_slots: int):
    self.config, self.vocab_size, self.num_classes = config, vocab_size, num_classes
    self.max_slots = max_slots  # every model is built alike, so programs are shared
    self._cache = {}
    self._lock = threading.Lock()  # groups side by side share the cache (`runs.runner`)
    self.mesh = make_mesh('data')  # module docstring: data parallel
    self.replicated = NamedSharding(self.mesh, P())
    self._rows = NamedSharding(self.mesh, P('data'))

  def split_rows(self, batch: dict, rows: int) -> dict:
    """`batch` with each array of `rows` rows laid along the mesh (inside a
    traced program; the rest, e.g. the class count, left to XLA)."""
    if self.mesh.size == 1:
      return batch
    return {k: jax.lax.with_sharding_constraint(v, self._rows)
            if v.ndim and v.shape[0] == rows else v for k, v in batch.items()}

  @classmethod
  def for_tasks(cls, config: ml_collections.ConfigDict, tasks: list[TaskSpec]):
    """The programs of a run over `tasks` (their shared sizes: `sizes`)."""
    return cls(config, *sizes(tasks, config.eval.max_length))

  def _get(self, key, make):
    # `make` is quick: a `jax.jit` wrapper (compiled on its first call), or
    # the hard set's few fixed batches.
    with self._lock:
      if key not in self._cache:
        self._cache[key] = make()
      return self._cache[key]

  def models(self, encoding, seeds):
    """(graphdef, params stacked over seeds `[S, …]`, the rest of the state)."""
    models = [build_model(encoding, self.config, s, vocab_size=self.vocab_size,
                          num_classes=self.num_classes, slots=self.max_slots) for s in seeds]
    graphdef, _, rest = nnx.split(models[0], nnx.Param, ...)
    params = jax.tree.map(lambda *a: jnp.stack(a),
                          *[nnx.split(m, nnx.Param, ...)[1] for m in models])
    return graphdef, params, rest

  def forward(self, graphdef, rest, params, batch, noise_key, kind, *, dropout_key=None):
    """Masked logits `[B, T, C]` of one model on one batch."""
    model = nnx.merge(graphdef, params, rest)
    noise = {} if kind is None else encoder_layout.noisy_positions(
        kind, noise_key, batch['lengths'], slots=batch['tokens'].shape[1],
        num_layers=self.config.model.num_layers,
        noise_max_length=self.config.model.noise_max_length)
    kwargs = dict(deterministic=True) if dropout_key is None else dict(
        deterministic=False, rngs=nnx.Rngs(dropout=dropout_key))
    logits = model(batch['tokens'], lengths=batch['lengths'], **noise, **kwargs)
    return _masked_logits(logits, batch['num_classes'][0])

  def train_data(self, task: TaskSpec, slots: int):
    """jit (seeds int32 [S], start) -> batches `[S, steps_per_call, …]`, one per step
    `start …`, and each step's noise and dropout keys and length bucket."""
    t = self.config.train

    ends = jnp.asarray(bucket_ends(self.config), jnp.int32)

    def one(seed, index):
      key = jax.random.fold_in(jax.random.key(seed), index)
      length_key, data_key, noise_key, dropout_key = jax.random.split(key, 4)
      if t.get('length_buckets', 0):  # one length per step for the run (module docstring)
        length_key = jax.random.fold_in(jax.random.key(LENGTH_SEED), index)
      length = jax.random.randint(length_key, (), t.min_length, t.max_length + 1, jnp.int32)
      batch = encoder_layout.encoder_batch(task, data_key, length, batch_size=t.batch_size,
                                   max_length=t.max_length, slots=slots)
      return dict(batch, noise_key=jax.random.key_data(noise_key),
                  dropout_key=jax.random.key_data(dropout_key),
                  bucket=jnp.searchsorted(ends, length).astype(jnp.int32))

    def make():
      steps = lambda seed, start: jax.vmap(lambda i: one(seed, i))(
          start + jnp.arange(t.steps_per_call))
      return jax.jit(jax.vmap(steps, in_axes=(0, None)), out_shardings=self.replicated)
    return self._get(('train_data', task.name, slots), make)

  def train_chunk(self, graphdef, rest, encoding: str, learning_rate: float,
                  slots: tuple[int, ...]):
    """jit (params, opt_state, batches, buckets int32 [steps_per_call]) ->
    (params, opt_state, loss [S], accuracy [S]); `slots`: each bucket's
    (`bucket_slots`), a step of bucket b cut to slots[b]."""
    kind = noise_kind(encoding)
    tx = optimizer(self.config, learning_rate)
    t = self.config.train

    def cut(batch, width):
      return {k: v[:, :width] if v.ndim == 2 else v for k, v in batch.items()}

    def step(carry, xs):
      batch, bucket = xs
      if len(slots) == 1:
        return at_slots(slots[0], carry, batch)
      return jax.lax.switch(bucket, [lambda c, b, w=w: at_slots(w, c, b) for w in slots],
                            carry, batch)

    def at_slots(width, carry, batch):
      params, opt_state = carry
      batch = dict(batch)
      keys = {k: jax.random.wrap_key_data(batch.pop(k)) for k in ('noise_key', 'dropout_key')}
      batch = self.split_rows(cut(batch, width), t.batch_size)

      def loss_fn(p):
        logits = self.forward(graphdef, rest, p, batch, keys['noise_key'], kind,
                              dropout_key=keys['dropout_key'])
        return encoder.loss_and_accuracy(logits, batch)

      (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
      updates, opt_state = tx.update(grads, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), (loss, accuracy)

    def one(params, opt_state, batches, buckets):
      (params, opt_state), (loss, acc) = jax.lax.scan(step, (params, opt_state),
                                                      (batches, buckets))
      return params, opt_state, jnp.mean(loss), jnp.mean(acc)

    # The buckets are the members' own (one length per step for all): not
    # mapped, so the switch runs one branch.
    make = lambda: (tx, jax.jit(jax.vmap(one, in_axes=(0, 0, 0, None)), donate_argnums=(0, 1)))
    return self._get(('train_chunk', encoding, float(learning_rate), slots), make)

  def eval_data(self, task: TaskSpec, slots: int, padded: int):
    """jit length -> the `num_samples // batch_size` sub-batches at that length."""
    e = self.config.eval

    def at(n):
      keys = jax.random.split(jax.random.fold_in(jax.random.key(e.seed), n),
                              e.num_samples // e.batch_size)

      def sub(k):
        data_key, noise_key = jax.random.split(k)
        batch = encoder_layout.encoder_batch(task, data_key, n, batch_size=e.batch_size,
                                     max_length=padded, slots=slots)
        # Folded from the sub-batch's key, not split: the data stay what they were.
        return dict(batch, noise_key=jax.random.key_data(noise_key),
                    dropout_key=jax.random.key_data(jax.random.fold_in(k, 1)))
      return jax.vmap(sub)(keys)
    return self._get(('eval_data', task.name, slots, padded),
                     lambda: jax.jit(at, out_shardings=self.replicated))

  def eval_batches(self, task: TaskSpec, n: int, slots: int, padded: int) -> dict:
    """The evaluation's sub-batches at length n, with the task's class count;
    kept for the next encoding when `eval.cache` (the same data for all)."""
    key = ('eval_batches', task.name, n, slots, padded)
    if key in self._cache:
      return self._cache[key]
    batches = self.eval_data(task, slots, padded)(jnp.int32(n))
    batches['num_classes'] = jnp.full(batches['lengths'].shape[:1] + (1,), task.output_size,
                                      jnp.int32)
    if self.config.eval.get('cache', False):
      self._cache[key] = batches
    return batches

  def eval_accuracy(self, graphdef, rest, encoding: str, slots: int):
    """jit (params [S, …], sub-batches) -> accuracy [S], their mean of the
    sub-batches' accuracies."""
    kind = noise_kind(encoding)
    dropout = not self.config.eval.get('deterministic', True)  # module docstring

    def one(params, batches):
      def sub(batch):
        key = jax.random.wrap_key_data(batch.pop('noise_key'))
        dropout_key = jax.random.wrap_key_data(batch.pop('dropout_key'))
        batch = self.split_rows(batch, self.config.eval.batch_size)
        logits = self.forward(graphdef, rest, params, batch, key, kind,
                              dropout_key=dropout_key if dropout else None)
        return encoder.batch_accuracy(logits, batch)
      return jnp.mean(jax.lax.map(sub, batches))
    make = lambda: jax.jit(jax.vmap(one, in_axes=(0, None)))
    return self._get(('eval_accuracy', encoding, slots), make)


def optimizer(config: ml_collections.ConfigDict, learning_rate: float):
  """Theirs: `optax.chain(clip_by_global_norm(max_grad_norm), adam(lr))`
  (their `max_grad_norm` is our `train.grad_clip_norm`)."""
  return optax.chain(optax.clip_by_global_norm(config.train.grad_clip_norm),
                     optax.adam(learning_rate))


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
  shapes = {encoder_layout.padded_slots(task, t.max_length) for task in group}
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
