"""The training loop: build, restore, compile once, step, log, checkpoint.

Data parallel over every local device with one code path: a 1-D mesh named
'data', the state replicated, each batch sharded along its first axis (one
device is the same code with a mesh of one).
"""

import os
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import ml_collections
import optax
import tqdm
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from attention_jax.lab import identity
from attention_jax.lab import models
from attention_jax.lab import tasks
from attention_jax.lab.train.checkpoint import Checkpointer
from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.train.interrupt import raise_if_stopped
from attention_jax.lab.train.interrupt import stop_requests
from attention_jax.lab.train.metrics import MetricsWriter
from attention_jax.lab.train.optimizer import learning_rate_schedule
from attention_jax.lab.train.optimizer import make_optimizer
from attention_jax.lab.train.step import step_function

def data_mesh() -> jax.sharding.Mesh:
  """A 1-D mesh 'data' over every device (all hosts' with jax.distributed).

  The axis is 'Auto' (XLA propagates shardings from our constraints), not the
  'Explicit' default of recent JAX, which would make every op's sharding part
  of its type.
  """
  axis_type = getattr(jax.sharding, 'AxisType', None)
  kwargs = {'axis_types': (axis_type.Auto,)} if axis_type else {}
  return jax.make_mesh((jax.device_count(),), ('data',), **kwargs)


def train(config: ml_collections.ConfigDict, workdir: Optional[str] = None,
          *, progress: bool = True, tx: Optional[optax.GradientTransformation] = None,
          ) -> tuple[nnx.Module, dict[str, float]]:
  """Trains one model, resuming from `workdir`'s latest checkpoint if any;
  returns the model and the last logged step's metrics.

  With a `workdir`: the config in `config.json` (a workdir trained with
  another config is refused, see `lab.identity`), one JSON line per step in
  `metrics.jsonl`, TensorBoard files in `tensorboard/` (if
  `config.train.tensorboard`), checkpoints in `checkpoints/` every
  `config.train.checkpoint_every` steps and at the end. SIGTERM or Ctrl-C (or
  reaching `config.train.stop_after` steps, for time-boxed jobs) saves a
  checkpoint and raises `TrainingInterrupted`; a signal after the last step
  is left to the enclosing `stop_requests` scope (the caller's next check).
  Host-device syncs happen every `config.train.log_every` steps only.

  `tx` defaults to `make_optimizer(config.train)`. The compiled step is
  memoised on the static structure, which includes the optimizer object, so
  a sweep passes one `tx` to all its runs to compile once per architecture
  instead of once per run.
  """
  with stop_requests():
    raise_if_stopped(f'before training {workdir or "a model"}')
    if workdir:
      identity.claim(workdir, config)  # before anything is built: a mismatch is one message
    return _train(config, workdir, progress=progress, tx=tx)


def _train(config, workdir, *, progress, tx):
  t_cfg = config.train
  task = tasks.get_task(config.task.name)
  model = models.build_model(config, t_cfg.seed)
  optimizer = nnx.Optimizer(model, tx or make_optimizer(t_cfg), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  mesh = data_mesh()
  state = jax.device_put(state, NamedSharding(mesh, P()))  # replicated
  seed = jnp.int32(t_cfg.seed)
  jitted = step_function(
      graphdef=graphdef, task=task,
      batch_size=t_cfg.batch_size, min_length=config.task.train_min_length,
      max_length=config.task.train_max_length, vocab_size=config.task.vocab_size,
      layout=models.batch_layout(model), data_sharding=NamedSharding(mesh, P('data')),
      max_position=models.randomized_max_position(config), steps_per_call=t_cfg.steps_per_call)
  step_fn = lambda state, step: jitted(state, step, seed)
  k = t_cfg.steps_per_call  # steps per call; validated to divide every interval
  schedule = learning_rate_schedule(t_cfg)

  checkpointer = None
  start = 0
  if workdir:
    os.makedirs(workdir, exist_ok=True)
    checkpointer = Checkpointer(os.path.join(workdir, 'checkpoints'),
                                every=t_cfg.checkpoint_every or t_cfg.num_steps,
                                keep=t_cfg.checkpoint_keep)
    state, start = checkpointer.restore_latest(state)
  writer = MetricsWriter(workdir, start_step=start, tensorboard=t_cfg.tensorboard,
                         config_json=config.to_json_best_effort(indent=1, sort_keys=True))
  bar = tqdm.tqdm(total=t_cfg.num_steps, initial=start, unit='step', dynamic_ncols=True,
                  leave=False, disable=not progress or jax.process_index() != 0)
  pending, last, clock = [], {}, (time.perf_counter(), start)
  try:
    with stop_requests() as stop:
      for step in range(start, t_cfg.num_steps, k):
        state, metrics = step_fn(state, np.int32(step))  # metrics: [k] per key
        pending.append(metrics)
        done = step + k
        stopping = stop.signal or done == t_cfg.stop_after
        if len(pending) * k >= t_cfg.log_every or done == t_cfg.num_steps or stopping:
          rate = (done - clock[1]) / (time.perf_counter() - clock[0])
          rows = [{key: v[i] for key, v in m.items()}
                  for m in jax.device_get(pending) for i in range(k)]
          for i, m in enumerate(rows):
            s = done - len(rows) + i
            last = {key: float(v) for key, v in m.items()}
            last.update(step=s, learning_rate=float(schedule(s)), steps_per_second=rate)
            writer.write(last)
          bar.update(len(rows))
          bar.set_postfix(loss=f"{last['loss']:.3f}", acc=f"{last['token_accuracy']:.3f}",
                          steps_s=f'{rate:.0f}')
          pending = []
        if checkpointer:
          writer.flush()
          checkpointer.maybe_save(done, state)
        if stopping:
          if checkpointer:
            checkpointer.close(state, done)
            checkpointer = None
          cause = f'signal {stop.signal}' if stop.signal else 'train.stop_after'
          saved = (f'checkpoint saved in {workdir}; run the same command again to '
                   'resume.' if workdir else 'no workdir: nothing saved.')
          raise TrainingInterrupted(
              f'stopped by {cause} after step {done} of {t_cfg.num_steps}; {saved}',
              stop.signal)
    if checkpointer:  # finished: the final state, saved once
      checkpointer.close(state, t_cfg.num_steps)
      checkpointer = None
  finally:
    bar.close()
    writer.close()
    if checkpointer:  # an error: wait for saves in flight, add none
      checkpointer.close()
  model, _ = nnx.merge(graphdef, state)
  return model, last


def load_trained(config: ml_collections.ConfigDict, workdir: str,
                 tx: Optional[optax.GradientTransformation] = None) -> nnx.Module:
  """The model of the finished run in `workdir`, restored from its final
  checkpoint without training and without writing anything. A missing run,
  an unfinished one or one trained with another config (`lab.identity`) is
  a `ConfigError` saying which."""
  problem = identity.mismatch(workdir, config)
  if problem:
    raise identity.RunMismatch(problem, 'pass the config that run was trained with.')
  directory = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(directory):
    raise identity.ConfigError(f'{workdir} holds no trained run (no checkpoints/); '
                               'train it first.')
  model = models.build_model(config, config.train.seed)
  optimizer = nnx.Optimizer(model, tx or make_optimizer(config.train), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  checkpointer = Checkpointer(directory, every=config.train.num_steps,
                              keep=config.train.checkpoint_keep)
  try:
    state, step = checkpointer.restore_latest(state, set_aside=False)
  finally:
    checkpointer.close()
  if step != config.train.num_steps:
    raise identity.ConfigError(f'{workdir} is not finished: its latest readable checkpoint is '
                               f'step {step} of {config.train.num_steps}; resume its training '
                               'first.')
  model, _ = nnx.merge(graphdef, state)
  return model
