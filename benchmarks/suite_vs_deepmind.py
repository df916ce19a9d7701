r"""DeepMind's suite: our trainer beside DeepMind's own code, the same model.

  pip install dm-haiku tabulate   # their code's dependencies beyond ours
  git clone https://github.com/google-deepmind/randomized_positional_encodings \
      /tmp/deepmind/randomized_positional_encodings
  python -m benchmarks.suite_vs_deepmind --deepmind_root=/tmp/deepmind

Both train the chomsky CPU preset's model (configs/chomsky.py: 2 layers,
d_model 32, 4 heads, batch 16, one length per batch uniform in 1–10) on one
task and encoding. Theirs: `experiments/training.py`'s update step
(`_update_parameters`, jitted, one program per length) driven as their
`TrainingWorker.run` drives it (a length from their uniform curriculum, a
batch from the task's `sample_batch`, one step per call). Ours:
`lab.train.suite_trainer.train` (the padded shape of the task's longest
length, `train.steps_per_call` steps per compiled call, seeds vmapped), and
with `--length_buckets=K` also ours with `train.length_buckets=K` (each step
at its length's bucket of K: 'ours_buckets').

Per model-step is the time of a run with everything compiled, divided by
steps × models (theirs trains one model at a time, ours `--seeds` at once);
end to end includes the compiles (ours: one program per padded shape;
theirs: one per length). The median of `--repeats` runs, interleaved
(`timing.interleaved`). Results: `benchmarks/results/suite_vs_deepmind.*`.
"""

import functools
import json
import os
import random
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import timing
from configs import chomsky as chomsky_config

_ROOT = flags.DEFINE_string('deepmind_root', None, 'a folder holding their package, '
                            'randomized_positional_encodings/ (a clone of their repository)',
                            required=True)
_TASK = flags.DEFINE_string('task', 'reverse_string', 'a task both codes have')
# Theirs: NOISY_RELATIVE is their randomized relative encoding (our
# 'relative:randomized'); RELATIVE the plain one ('relative').
_ENCODINGS = {'relative:randomized': 'NOISY_RELATIVE', 'relative': 'RELATIVE',
              'none': 'NONE', 'rope:randomized': 'NOISY_ROTARY'}
_ENCODING = flags.DEFINE_enum('encoding', 'relative:randomized', list(_ENCODINGS),
                              'ours; theirs is the same encoding in their code')
_STEPS = flags.DEFINE_integer('steps', 500, 'training steps per timed run')
_SEEDS = flags.DEFINE_integer('seeds', 1, 'models ours trains at once (vmapped)')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'timed runs of each')
_BUCKETS = flags.DEFINE_integer('length_buckets', 0, 'K > 0: also time ours with '
                                'train.length_buckets=K')
_OUT = flags.DEFINE_string('out', 'benchmarks/results/suite_vs_deepmind', 'results path '
                           'prefix (.json, .md); empty: print only')


def _config(steps: int, buckets: int = 0):
  c = chomsky_config.get_config()  # the CPU preset
  c.train.length_buckets = buckets
  c.train.num_steps = steps
  c.train.checkpoint_every = steps
  c.train.log_every = steps
  return c


def ours(task_name: str, encoding: str, steps: int, seeds: int, buckets: int = 0):
  """A call that trains `seeds` models for `steps` steps (programs compiled
  by its first call)."""
  from attention_jax.lab import tasks  # pylint: disable=import-outside-toplevel
  from attention_jax.lab.train import suite_programs  # pylint: disable=import-outside-toplevel
  from attention_jax.lab.train import suite_trainer  # pylint: disable=import-outside-toplevel
  c = _config(steps, buckets)
  task = tasks.get_spec(task_name)
  programs = suite_programs.Programs.for_tasks(c, [task])

  def run():
    out = suite_trainer.train(programs, [task], encoding, list(range(seeds)), 1e-3,
                              progress=lambda _: None)
    return out[1]

  return run


def theirs(root: str, task_name: str, encoding: str, steps: int):
  """Their training steps as `TrainingWorker.run` takes them (every length's
  program compiled by a first run), and a builder of a fresh step function
  for the end-to-end time."""
  sys.path.insert(0, root)
  import haiku as hk  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  from randomized_positional_encodings.experiments import constants  # pylint: disable=import-outside-toplevel
  from randomized_positional_encodings.experiments import curriculum as curriculum_lib  # pylint: disable=import-outside-toplevel
  from randomized_positional_encodings.experiments import training  # pylint: disable=import-outside-toplevel
  from randomized_positional_encodings.experiments import utils  # pylint: disable=import-outside-toplevel
  c = _config(steps)
  task = constants.TASK_BUILDERS[task_name]()
  model = constants.MODEL_BUILDERS['transformer_encoder'](
      output_size=task.output_size, return_all_outputs=True, num_layers=c.model.num_layers,
      embedding_dim=c.model.d_model, num_heads=c.model.num_heads,
      dropout_prob=c.model.dropout, positional_encodings=_ENCODINGS[encoding],
      positional_encodings_params=({'noise_max_length': c.positions.max_position}
                                   if _ENCODINGS[encoding].startswith('NOISY') else {}))
  model = hk.transform(utils.make_model_with_empty_targets(model, task, 0, False))
  curriculum = curriculum_lib.UniformCurriculum(
      values=list(range(c.task.train_min_length, c.task.train_max_length + 1)))

  def loss_fn(output, target):  # their example.py's
    return jnp.mean(jnp.sum(task.pointwise_loss_fn(output, target), axis=-1)), {}

  def accuracy_fn(output, target):
    mask = task.accuracy_mask(target)
    return jnp.sum(mask * task.accuracy_fn(output, target)) / jnp.sum(mask)

  optimizer = optax.chain(optax.clip_by_global_norm(c.train.grad_clip_norm),
                          optax.adam(1e-3))
  rng = hk.PRNGSequence(0)
  params = model.init(jax.random.PRNGKey(0),
                      task.sample_batch(next(rng), length=10, batch_size=c.train.batch_size)[
                          'input'])

  def run(update=training._update_parameters):  # pylint: disable=protected-access
    random.seed(0)
    np.random.seed(0)
    p, opt_state = params, optimizer.init(params)
    for step in range(steps):
      length = curriculum.sample_sequence_length(step)
      batch = task.sample_batch(next(rng), length=length, batch_size=c.train.batch_size)
      p, opt_state, _ = update(p, next(rng), batch, model.apply, loss_fn, accuracy_fn,
                               optimizer, opt_state)
    return p

  def fresh():  # their update step with an empty compile cache
    return run(jax.jit(training._update_parameters.__wrapped__, static_argnames=(  # pylint: disable=protected-access
        'model_apply_fn', 'loss_fn', 'accuracy_fn', 'optimizer', 'is_autoregressive')))

  return run, fresh


def main(_):
  steps, seeds, buckets = _STEPS.value, _SEEDS.value, _BUCKETS.value
  runs = {'ours': ours(_TASK.value, _ENCODING.value, steps, seeds)}
  if buckets:
    runs['ours_buckets'] = ours(_TASK.value, _ENCODING.value, steps, seeds, buckets)
  theirs_run, theirs_fresh = theirs(_ROOT.value, _TASK.value, _ENCODING.value, steps)
  # End to end, compiles included: each the first run of its code here.
  first = {}
  for name, run in (('deepmind', theirs_fresh), *runs.items()):
    start = time.perf_counter()
    jax.block_until_ready(run())
    first[name] = time.perf_counter() - start
  times = timing.interleaved({'deepmind': theirs_run, **runs}, _REPEATS.value, warm_up=True)
  stats = {name: timing.stats(t) for name, t in times.items()}
  models = {name: 1 if name == 'deepmind' else seeds for name in stats}
  per_step = {name: stats[name]['median_s'] / (steps * models[name]) for name in stats}
  row = dict(task=_TASK.value, encoding=_ENCODING.value, steps=steps, seeds=seeds,
             length_buckets=buckets, repeats=_REPEATS.value, jax=jax.__version__,
             device=jax.devices()[0].device_kind,
             ms_per_model_step={k: 1e3 * v for k, v in per_step.items()},
             ours_per_step_speed=per_step['deepmind'] / per_step['ours'],
             end_to_end_s=first,
             end_to_end_speed_per_model=(first['deepmind'] * seeds) / first['ours'],
             times=times)
  if buckets:
    row.update(ours_buckets_per_step_speed=per_step['deepmind'] / per_step['ours_buckets'],
               ours_buckets_end_to_end_speed_per_model=(first['deepmind'] * seeds)
               / first['ours_buckets'])
  print(json.dumps(row, indent=1))
  if _OUT.value:
    path = (f'{_OUT.value}_{_TASK.value}_{_ENCODING.value.replace(":", "_")}_{seeds}seeds'
            + (f'_{buckets}buckets' if buckets else ''))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + '.json', 'w') as f:
      json.dump(row, f, indent=1)


if __name__ == '__main__':
  app.run(main)
