"""The training loop: build, restore, compile once, step, log, checkpoint.

One run (`train`) or all seeds of one setup in one program (`train_seeds`).
Over every device with one code path, on the mesh `train.mesh` names
(`train.mesh`): data parallel by default (a 1-D mesh 'data', the state
replicated, each batch sharded along its first axis; one device is the same
code with a mesh of one; for stacked seeds, the seed axis is laid along the
mesh instead when there are enough seeds), or FSDP, or tensor parallel.
"""

import contextlib
import math
import os
import sys
import time
from typing import Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import ml_collections
import optax
import tqdm
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from attention_jax.lab.config import identity
from attention_jax.lab.runs import locks
from attention_jax.lab.config import entries
from attention_jax.lab.protocols import decoder
from attention_jax.lab.train import divergence
from attention_jax.lab.train.checkpoint import Checkpointer
from attention_jax.lab.train.interrupt import TIME_BUDGET
from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.train.interrupt import raise_if_stopped
from attention_jax.lab.train.interrupt import stop_requests
from attention_jax.lab.train import mesh as meshes
from attention_jax.lab.train.mesh import training_mesh
from attention_jax.lab.train.metrics import MetricsWriter
from attention_jax.lab.train.optimizer import learning_rate_schedule
from attention_jax.lab.train.optimizer import make_optimizer
from attention_jax.lab.train.step import step_function
from attention_jax.lab.config.resolved import ResolvedRun
from attention_jax.lab.config.resolved import resolve


def data_mesh() -> jax.sharding.Mesh:
  """A 1-D mesh 'data' over every device (all hosts' with jax.distributed):
  `train.mesh='data'`'s (`train.mesh`)."""
  return meshes.make('data')


# The clock of the time budget (`train.max_minutes`); tests move it.
_now = time.monotonic


def time_budget(config: ml_collections.ConfigDict, started: Optional[float] = None
                ) -> Optional[float]:
  """When this invocation's `train.max_minutes` (counted from `started`,
  default now, on `_now`'s clock) runs out; None without a budget.

  The budget is counted from the invocation's start (the entry points call
  this before anything is built or compiled), not from the first step: it
  exists so that a job stops, checkpointed and with exit status 75, before a
  cluster scheduler's wall-clock limit kills it, and that limit counts the
  start-up and compilation too; a budget counted from the first step would
  let a job overrun its slot by the compile time. The price is that a box
  shorter than the start-up trains little per invocation: the loop warns
  then (`short_box_warning`)."""
  minutes = config.train.get('max_minutes', 0)
  if not minutes:
    return None
  return (_now() if started is None else started) + 60 * minutes


def out_of_time(deadline: Optional[float]) -> bool:
  return deadline is not None and _now() >= deadline


def short_box_warning(t_cfg: ml_collections.ConfigDict, *, steps: int, startup: float,
                      training: float, first_call: int) -> Optional[str]:
  """The warning for a time box that ended (before the run's end) having
  trained less than one interval (`train.log_every`, or `checkpoint_every`
  if smaller) this invocation, or having spent more of it starting than
  training; else None. `steps`: trained this invocation; `startup`: seconds
  from the budget's start until the first compiled call (`first_call` steps)
  returned, the build, restore and compile included; `training`: seconds
  after it."""
  interval = min(v for v in (t_cfg.log_every, t_cfg.checkpoint_every) if v)
  if steps >= interval and startup <= training:
    return None
  per_step = training / (steps - first_call) if steps > first_call else 0.0
  # Enough for start-up to be at most half the box and for one interval.
  minutes = math.ceil(max(2 * startup, startup + interval * per_step) / 6) / 10
  return (f'warning: train.max_minutes={t_cfg.max_minutes:g} ended this invocation after '
          f'{steps} steps (one interval is {interval}): {startup:.1f}s went to starting and '
          f'compiling (until the first compiled call returned), {training:.1f}s to training; '
          'every rerun starts and compiles again, so each advances about as little. Set '
          f'train.max_minutes above ~{minutes:g} for an invocation to train more than it '
          'spends starting.')


@contextlib.contextmanager
def claimed(configs: list[ml_collections.ConfigDict], workdirs: list[Optional[str]]):
  """Holds every run directory's lock (`lab.runs.locks`; `study.on_locked`
  says whether to refuse or wait) and records each config in it
  (`identity.claim`; an extension, a larger `train.num_steps`, is printed
  in one line); a mismatch is refused before anything is written."""
  pairs = [(c, w) for c, w in zip(configs, workdirs) if w]
  for c, w in pairs:
    problem = identity.mismatch(w, c)
    if problem:
      raise identity.RunMismatch(problem)
  with locks.hold_all([w for _, w in pairs], wait=locks.waits(configs[0]),
                      log=lambda m: print(m, flush=True), should_stop=raise_if_stopped):
    for c, w in pairs:
      # Again under the lock: the holder before us may have finished.
      grown = identity.claim(w, c)
      if grown and jax.process_index() == 0:
        print(identity.describe_extension(w, grown), flush=True)
    yield


def train(config: Union[ml_collections.ConfigDict, ResolvedRun], workdir: Optional[str] = None,
          *, progress: bool = True, tx: Optional[optax.GradientTransformation] = None,
          deadline: Optional[float] = None) -> tuple[nnx.Module, dict[str, float]]:
  """Trains one model, resuming from `workdir`'s latest checkpoint if any;
  returns the model and the last logged step's metrics. `config` is the
  run's config or its record (`config.resolved`); a config is resolved here,
  and the record's completed config is what `config.json` holds.

  With a `workdir`: the config in `config.json` (a workdir trained with
  another config is refused, see `lab.config.identity`), one JSON line per step in
  `metrics.jsonl`, TensorBoard files in `tensorboard/` (if
  `config.train.tensorboard`), checkpoints in `checkpoints/` every
  `config.train.checkpoint_every` steps and at the end. SIGTERM or Ctrl-C (or
  reaching `config.train.stop_after` steps, for time-boxed jobs) saves a
  checkpoint and raises `TrainingInterrupted`; a signal after the last step
  is left to the enclosing `stop_requests` scope (the caller's next check).
  So does the time budget: `deadline` (a `_now()` time; default: now +
  `config.train.max_minutes`, none if 0), checked after every compiled call,
  raises with exit status `TIME_BUDGET`, after one line on stderr if the box
  was too short to train one interval (`short_box_warning`). A workdir
  whose run was trained toward a smaller `train.num_steps` is extended to
  this one (`identity.extension`). Host-device syncs happen every
  `config.train.log_every` steps only; a non-finite loss seen there stops
  the run (`divergence`: `diverged.json`, its checkpoints kept, the last
  metrics with `diverged_at`), and a run that diverged before is restored
  but not trained.

  `workdir` is locked for the whole training (`lab.runs.locks`): a second process
  on it is refused with one line naming the holder, or waits
  (`study.on_locked='wait'`).

  `tx` defaults to `make_optimizer(config.train)`. The compiled step is
  memoised on the static structure, which includes the optimizer object, so
  a sweep passes one `tx` to all its runs to compile once per architecture
  instead of once per run.
  """
  run = resolve(config)
  with stop_requests():
    raise_if_stopped(f'before training {workdir or "a model"}')
    deadline = time_budget(run.config) if deadline is None else deadline
    with claimed([run.config], [workdir]):  # before anything is built: a mismatch is one message
      return _train([run], [workdir], progress=progress, tx=tx, deadline=deadline)[0]


def train_seeds(configs: list[Union[ml_collections.ConfigDict, ResolvedRun]], workdirs: list[Optional[str]],
                *, progress: bool = True, tx: Optional[optax.GradientTransformation] = None,
                deadline: Optional[float] = None,
                ) -> list[tuple[nnx.Module, dict[str, float]]]:
  """Trains the seeds of one setup (`configs` equal but for `train.seed`) in
  ONE compiled program: their (model, optimizer) states stacked on a leading
  seed axis, one step `jax.vmap`-ed over it (`step_function(vmap_seeds=True)`),
  each seed with its own parameter init and its own `(seed, step)` data
  stream, so each equals its sequential run to float tolerance. Each seed
  keeps its own run directory (config.json, metrics.jsonl, checkpoints) as
  `train` writes it, and a stop saves every seed. Returns `(model, last
  metrics)` per seed.

  Seeds whose checkpoints stand at different steps (a sequential run stopped
  half-way) are trained one after another by `train` instead.

  Devices: with at least as many seeds as devices (and a multiple of them),
  the seed axis is the mesh axis (seeds spread over devices, each seed's
  batch on one); else the state is replicated and each batch split over the
  devices, as `train` does. Locks and the time budget (`deadline`) as in
  `train`, for every seed's directory.
  """
  runs = [resolve(c) for c in configs]
  with stop_requests():
    raise_if_stopped(f'before training {workdirs[0] or "a model"}')
    deadline = time_budget(runs[0].config) if deadline is None else deadline
    with claimed([r.config for r in runs], workdirs):
      starts = {_latest_step(w) for w in workdirs}
      if len(runs) == 1 or len(starts) > 1:
        return [train(r, w, progress=progress, tx=tx, deadline=deadline)
                for r, w in zip(runs, workdirs)]
      return _train(runs, workdirs, progress=progress, tx=tx, vmapped=True,
                    deadline=deadline)


def _latest_step(workdir: Optional[str]) -> int:
  """Newest checkpoint step in `workdir` by folder name (0 if none); the
  restore itself decides what is readable."""
  return max(identity.checkpoint_steps(workdir), default=0)


def run_name(configs: list[ml_collections.ConfigDict]) -> str:
  """What the progress bar and the resume line call a run, from its own
  config (not its folder): 'TASK/LABEL seedN', or 'seeds 0,1,2' for the
  stacked seeds of one setup; LABEL as in results.csv's encoding column."""
  c = configs[0]
  label = entries.run_label(c)
  seeds = ','.join(str(x.train.seed) for x in configs)
  return f"{c.task.name}/{label} seed{'s ' if len(configs) > 1 else ''}{seeds}"


def _train(runs, workdirs, *, progress, tx, vmapped=False, deadline=None):
  """The loop over one run (`vmapped=False`, one `ResolvedRun`) or a
  stacked group of seeds; see `train` and `train_seeds`."""
  configs = [r.config for r in runs]
  config, t_cfg = configs[0], configs[0].train
  tx = tx or make_optimizer(t_cfg)
  built = [r.build_model(c.train.seed) for r, c in zip(runs, configs)]
  splits = [nnx.split((m, nnx.Optimizer(m, tx, wrt=nnx.Param))) for m in built]
  graphdef, layout = splits[0][0], decoder.batch_layout(built[0])
  num_seeds, devices = len(configs), jax.device_count()
  mesh, rules = training_mesh(t_cfg), meshes.rules_of(t_cfg)
  seed_axis = (vmapped and rules is None and num_seeds >= devices
               and num_seeds % devices == 0)
  data_sharding = None if seed_axis else NamedSharding(mesh, P(meshes.batch_axis(mesh)))
  jitted = step_function(
      graphdef=graphdef, task=runs[0].training_task,
      batch_size=t_cfg.batch_size, min_length=config.task.train_min_length,
      max_length=config.task.train_max_length, vocab_size=config.task.vocab_size,
      layout=layout, data_sharding=data_sharding,
      max_position=runs[0].randomized_max_position, draw=config.positions.draw,
      steps_per_call=t_cfg.steps_per_call, vmap_seeds=vmapped)
  k = t_cfg.steps_per_call  # steps per call; validated to divide every interval
  schedule = learning_rate_schedule(t_cfg)

  checkpointers = [None] * num_seeds
  states, start = [s for _, s in splits], 0
  for i, workdir in enumerate(workdirs):
    if workdir:
      os.makedirs(workdir, exist_ok=True)
      checkpointers[i] = Checkpointer(os.path.join(workdir, 'checkpoints'),
                                      every=t_cfg.checkpoint_every or t_cfg.num_steps,
                                      keep=t_cfg.checkpoint_keep)
      states[i], start = checkpointers[i].restore_latest(states[i])
  # Runs that diverged before (`divergence`): restored for evaluation, never
  # trained or checkpointed again, their metrics.jsonl left as it is.
  diverged = {i: d for i, w in enumerate(workdirs) if (d := divergence.diverged_at(w)) is not None}
  for i in diverged:
    checkpointers[i].close()
    checkpointers[i] = None
  specs = meshes.state_specs(states[0], rules)
  if rules is not None:  # before anything compiles: a weight its mesh axis does not divide
    meshes.check_divides(states[0], specs, mesh, t_cfg.get('mesh', 'data'))
  if vmapped:
    seed = jnp.asarray([c.train.seed for c in configs], jnp.int32)
    state = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    state = (jax.device_put(state, NamedSharding(mesh, P('data'))) if seed_axis
             else meshes.place(state, mesh, meshes.with_seed_axis(specs)))
    per_seed = lambda tree, i: jax.tree.map(lambda x: x[i], tree)
  else:
    seed = jnp.int32(t_cfg.seed)
    state = meshes.place(states[0], mesh, specs)  # 'data': replicated
    per_seed = lambda tree, i: tree
  del states, splits, built
  writers = [MetricsWriter(None if i in diverged else w, start_step=start, tensorboard=t_cfg.tensorboard,
                           config_json=c.to_json_best_effort(indent=1, sort_keys=True))
             for i, (c, w) in enumerate(zip(configs, workdirs))]
  # Named by the run ('copy/rope seed0'): a study may show two setups' bars at once.
  desc = run_name(configs)
  show = jax.process_index() == 0
  if 0 < start < t_cfg.num_steps and show and not progress:  # the bar shows it otherwise
    print(f'{desc}: resuming from step {start} of {t_cfg.num_steps}', flush=True)
  bar = tqdm.tqdm(total=t_cfg.num_steps, initial=start, unit='step', dynamic_ncols=True,
                  leave=False, desc=desc, disable=not progress or not show)
  pending, last, clock = [], [{}] * num_seeds, (time.perf_counter(), start)
  # The budget's start (for the warning of a box that ends too early), and
  # when the first compiled call returned: on `_now`'s clock, read where
  # the deadline is checked anyway.
  boxed_from = deadline - 60 * t_cfg.max_minutes if deadline and t_cfg.max_minutes else None
  first_return = None

  def save(done, force=False):
    """Every seed's state after `done` steps to its own run directory."""
    if not any(checkpointers):
      return
    host = jax.device_get(state) if vmapped else state
    for i, (ckpt, writer) in enumerate(zip(checkpointers, writers)):
      if ckpt:
        writer.flush()
        (ckpt.close(per_seed(host, i), done) if force else ckpt.maybe_save(done, per_seed(host, i)))

  try:
    with stop_requests() as stop:
      for step in range(start, t_cfg.num_steps, k):
        if len(diverged) == num_seeds:
          break  # every run diverged: nothing left to train
        with meshes.active(mesh, rules):  # the mesh, and the rules its constraints read
          state, metrics = jitted(state, np.int32(step), seed)  # [k] or [k, S] per key
        pending.append(metrics)
        done = step + k
        now = _now() if deadline is not None else None
        timed_out = now is not None and now >= deadline
        first_return = now if first_return is None else first_return
        stopping = stop.signal or done == t_cfg.stop_after or timed_out
        if len(pending) * k >= t_cfg.log_every or done == t_cfg.num_steps or stopping:
          rate = (done - clock[1]) / (time.perf_counter() - clock[0])
          fetched = jax.device_get(pending)
          for i, writer in enumerate(writers):
            if i in diverged:
              continue
            rows = [{key: v[j][i] if vmapped else v[j] for key, v in m.items()}
                    for m in fetched for j in range(k)]
            bad = divergence.first_nonfinite([float(m['loss']) for m in rows])
            if bad is not None:  # the rows up to the first non-finite loss, then stop it
              rows = rows[:bad + 1]
            for r, m in enumerate(rows):
              s = done - len(rows) + r
              last[i] = {key: float(v) for key, v in m.items()}
              last[i].update(step=s, learning_rate=float(schedule(s)), steps_per_second=rate)
              writer.write(last[i])
            if bad is not None:
              diverged[i] = last[i]['diverged_at'] = last[i]['step']
              divergence.record(workdirs[i], last[i]['step'], last[i]['loss'])
              if checkpointers[i]:  # the ones it has are kept; none with the diverged state
                writer.flush()
                checkpointers[i].close()
                checkpointers[i] = None
              if show:
                bar.write(f'{desc}: seed {configs[i].train.seed} diverged (loss '
                          f"{last[i]['loss']}) at step {last[i]['step']}; stopped, "
                          'left out of the means')
          bar.update(len(fetched) * k)
          shown = next((m for m in last if 'loss' in m), None)  # a diverged-before seed has none
          if shown:
            bar.set_postfix(loss=f"{shown['loss']:.3f}",
                            acc=f"{shown['token_accuracy']:.3f}", steps_s=f'{rate:.0f}')
          pending = []
        save(done)
        if stopping:
          save(done, force=True)
          checkpointers = [None] * num_seeds
          cause = (f'signal {stop.signal}' if stop.signal else
                   f'train.max_minutes={t_cfg.max_minutes:g} (this invocation\'s time budget)'
                   if timed_out else 'train.stop_after')
          where = ', '.join(w for w in workdirs if w)
          saved = (f'checkpoint saved in {where}; run the same command again to '
                   'resume.' if where else 'no workdir: nothing saved.')
          status = (TIME_BUDGET,) if timed_out and not stop.signal else ()
          warning = status and boxed_from is not None and done < t_cfg.num_steps and (
              short_box_warning(t_cfg, steps=done - start, startup=first_return - boxed_from,
                                training=now - first_return, first_call=k))
          if warning and show:
            bar.close()  # first: else the line is glued to the bar's in a log file
            print(warning, file=sys.stderr, flush=True)
          raise TrainingInterrupted(
              f'stopped by {cause} after step {done} of {t_cfg.num_steps}; {saved}',
              stop.signal, *status)
    save(t_cfg.num_steps, force=True)  # finished: the final state, saved once
    checkpointers = [None] * num_seeds
  finally:
    bar.close()
    for writer in writers:
      writer.close()
    for ckpt in checkpointers:  # an error: wait for saves in flight, add none
      if ckpt:
        ckpt.close()
  return [(nnx.merge(graphdef, per_seed(state, i))[0], last[i]) for i in range(num_seeds)]


def load_trained(config: Union[ml_collections.ConfigDict, ResolvedRun], workdir: str,
                 tx: Optional[optax.GradientTransformation] = None) -> nnx.Module:
  """The model of the finished run in `workdir`, restored from its final
  checkpoint without training and without writing anything. A missing run,
  an unfinished one or one trained with another config (`lab.config.identity`) is
  a `ConfigError` saying which. `config`: the run's config or its record."""
  run = resolve(config)
  config = run.config
  problem = identity.mismatch(workdir, config)
  if problem:
    raise identity.RunMismatch(problem, 'pass the config that run was trained with.')
  directory = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(directory):
    raise identity.ConfigError(f'{workdir} holds no trained run (no checkpoints/); '
                               'train it first.')
  model = run.build_model(config.train.seed)
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
