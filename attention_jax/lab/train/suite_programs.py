"""The compiled programs of a suite run under the encoder protocol: the
tasks' data generators, the train step (a `scan` over
`train.steps_per_call` steps, every seed at once) and the evaluation,
keyed by what shapes them so that settings of one shape share them
(`suite_trainer` trains and scores with them).

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
"""

import math
import threading
from typing import Optional

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from attention_jax.lab.protocols import encoder
from attention_jax.lab.protocols import encoder_layout
from attention_jax.lab.tasks.spec import TaskSpec
from attention_jax.lab.train.mesh import make as make_mesh
from attention_jax.lab.train.optimizer import adam_as_deepmind
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
  `train.length_buckets` equal ranges of task.train_min_length …
  train_max_length; [train_max_length] for 0."""
  low, high = config.task.train_min_length, config.task.train_max_length
  count = config.train.get('length_buckets', 0)
  if not count:
    return [high]
  span = high - low + 1
  return sorted({low - 1 + math.ceil(span * (j + 1) / count) for j in range(count)})


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
      encoding=name,
      max_positions=config.positions.max_position if noise_kind(encoding) else slots,
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
        noise_max_length=self.config.positions.max_position)
    kwargs = dict(deterministic=True) if dropout_key is None else dict(
        deterministic=False, rngs=nnx.Rngs(dropout=dropout_key))
    logits = model(batch['tokens'], lengths=batch['lengths'], **noise, **kwargs)
    return _masked_logits(logits, batch['num_classes'][0])

  def train_data(self, task: TaskSpec, slots: int):
    """jit (seeds int32 [S], start) -> batches `[S, steps_per_call, …]`, one per step
    `start …`, and each step's noise and dropout keys and length bucket."""
    t, lengths = self.config.train, self.config.task

    ends = jnp.asarray(bucket_ends(self.config), jnp.int32)

    def one(seed, index):
      key = jax.random.fold_in(jax.random.key(seed), index)
      length_key, data_key, noise_key, dropout_key = jax.random.split(key, 4)
      if t.get('length_buckets', 0):  # one length per step for the run (module docstring)
        length_key = jax.random.fold_in(jax.random.key(LENGTH_SEED), index)
      length = jax.random.randint(length_key, (), lengths.train_min_length,
                                  lengths.train_max_length + 1, jnp.int32)
      batch = encoder_layout.encoder_batch(task, data_key, length, batch_size=t.batch_size,
                                   max_length=lengths.train_max_length, slots=slots)
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
    tx = adam_as_deepmind(self.config.train.grad_clip_norm, learning_rate)
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
