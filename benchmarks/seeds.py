r"""Every seed in one compiled program: training throughput, side by side.

  pip install -r requirements-bench.txt
  python -m benchmarks.seeds [--seeds=1,3,10] [--steps=300] [--repeats=3] \
      [--paper] [--nopytorch] [--out=benchmarks/results]

For S seeds of configs/copy.py's default model (RoPE, d_model 64, 2 layers,
batch 32 × 18 tokens), each timed over --steps steps per seed, interleaved
A B C … --repeats times after a warm-up (compilation excluded):

  sequential     our compiled step (10 steps per call), seed after seed, as
                 the study ran before seeds were vmapped
  vmapped        all S seeds' states stacked on a leading axis, one program
                 (`step_function(vmap_seeds=True)`), each seed on its own
                 (seed, step) batch stream
  vmapped, 2 setups side by side
                 two such programs (seeds 0…S-1 and S…2S-1) in two threads at
                 once, as `study.parallel_setups=2` runs two setups: 2S seeds
  pytorch-eager  PyTorch's twin of the model (benchmarks/train_step.py),
                 seed after seed, forward, backward, clip, AdamW per step

Tokens/s are summed over seeds; the last column compares them. Before timing,
the vmapped program's first call is checked against the sequential one seed by
seed (losses equal to 1e-5). With --paper, also the `paper` preset (5 layers,
batch 128, training inputs 1–40) with 10 seeds stacked: bytes of the stacked
training state, XLA's FLOP count of one vmapped step and a measured CPU step
time, from which its runtime on an accelerator can be estimated. Writes
seeds.json and seeds.md into --out.
"""

import statistics
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags
from flax import nnx

from attention_jax.lab import tasks
from attention_jax.lab.train import make_optimizer
from attention_jax.lab.train.step import step_function
from attention_jax.lab.config.resolved import resolve
from benchmarks import timing
from benchmarks.report import write_report
from configs import copy as copy_config

_SEEDS = flags.DEFINE_list('seeds', ['1', '3', '10'], 'Numbers of seeds to time.')
_STEPS = flags.DEFINE_integer('steps', 300, 'Training steps per seed per timing.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed calls per row.')
_PAPER = flags.DEFINE_bool('paper', True, 'Also measure the paper preset with 10 seeds.')
_PYTORCH = flags.DEFINE_bool('pytorch', True, 'Time PyTorch eager too.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Output folder.')
_PER_CALL = 10  # steps per compiled call, as the study's train loop


def _states(config, seeds, tx):
  """graphdef and one (model, optimizer) state per seed."""
  graphdef, states = None, []
  for seed in seeds:
    model = resolve(config).build_model(seed)
    graphdef, state = nnx.split((model, nnx.Optimizer(model, tx, wrt=nnx.Param)))
    states.append(state)
  return graphdef, states


def _stack(states):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *states)


def _step_kwargs(config):
  t = config.task
  return dict(task=tasks.get_task(t.name), batch_size=config.train.batch_size,
              min_length=t.train_min_length, max_length=t.train_max_length,
              vocab_size=t.vocab_size, layout='decoder_only', steps_per_call=_PER_CALL)


def _time_setup(config, num_seeds, steps):
  """Row functions for one number of seeds; each runs `steps` steps per seed."""
  tx = make_optimizer(config.train)
  seeds = list(range(num_seeds))
  graphdef, states = _states(config, seeds, tx)
  kw = _step_kwargs(config)
  single = step_function(graphdef=graphdef, **kw)
  vmapped = step_function(graphdef=graphdef, vmap_seeds=True, **kw)
  seed_array = jnp.asarray(seeds, jnp.int32)

  # Same losses seed by seed on the first call, before anything is timed.
  _, seq_metrics = zip(*(single(jax.tree.map(jnp.copy, s), jnp.int32(0), jnp.int32(i))
                         for i, s in zip(seeds, states)))
  _, vm_metrics = vmapped(_stack([jax.tree.map(jnp.copy, s) for s in states]),
                          jnp.int32(0), seed_array)
  np.testing.assert_allclose(np.stack([m['loss'] for m in seq_metrics], -1),
                             vm_metrics['loss'], rtol=1e-5)

  # A second setup of the same shape (seeds S … 2S-1), for the side-by-side row.
  _, other = _states(config, [seed + num_seeds for seed in seeds], tx)
  other_seeds = seed_array + num_seeds
  holder = dict(seq=list(states), vm=_stack(states), pair=[_stack(states), _stack(other)])

  def sequential():
    for i in seeds:
      s = holder['seq'][i]
      for step in range(0, steps, _PER_CALL):
        s, _ = single(s, np.int32(step), jnp.int32(i))
      holder['seq'][i] = s
    jax.block_until_ready(holder['seq'])

  def vmapped_run():
    s = holder['vm']
    for step in range(0, steps, _PER_CALL):
      s, _ = vmapped(s, np.int32(step), seed_array)
    holder['vm'] = jax.block_until_ready(s)

  def side_by_side():
    def run(j, seed_arg):
      s = holder['pair'][j]
      for step in range(0, steps, _PER_CALL):
        s, _ = vmapped(s, np.int32(step), seed_arg)
      holder['pair'][j] = jax.block_until_ready(s)
    threads = [threading.Thread(target=run, args=a)
               for a in ((0, seed_array), (1, other_seeds))]
    for t in threads:
      t.start()
    for t in threads:
      t.join()

  # name -> (function, seeds it trains)
  rows = {'sequential': (sequential, num_seeds), 'vmapped': (vmapped_run, num_seeds),
          'vmapped, 2 setups side by side': (side_by_side, 2 * num_seeds)}
  if _PYTORCH.value:
    rows['pytorch-eager'] = (_pytorch_rows(config, seeds, steps), num_seeds)
  return rows


def _pytorch_rows(config, seeds, steps):
  import torch  # pylint: disable=g-import-not-at-top
  from benchmarks.torch_lm import TorchLM  # pylint: disable=g-import-not-at-top
  m, tr, t = config.model, config.train, config.task
  nets, opts = [], []
  for seed in seeds:
    net = TorchLM(t.vocab_size + tasks.NUM_SPECIAL, m.d_model, m.num_heads, m.num_layers,
                  m.mlp_dim)
    net.load(resolve(config).build_model(seed))
    nets.append(net)
    opts.append(torch.optim.AdamW(net.parameters(), lr=tr.learning_rate,
                                  betas=(tr.adam_b1, tr.adam_b2),
                                  weight_decay=tr.weight_decay))
  batch = tasks.train_batch(tasks.get_task(t.name), 0, jnp.int32(0), batch_size=tr.batch_size,
                            min_length=t.train_min_length, max_length=t.train_max_length,
                            vocab_size=t.vocab_size)
  inputs, targets = (torch.from_numpy(np.asarray(batch[k]).astype(np.int64))
                     for k in ('inputs', 'targets'))
  weight = torch.from_numpy(np.asarray(batch['loss_mask']).astype(np.float32))

  def run():
    for net, opt in zip(nets, opts):
      for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        logits = net(inputs)
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets,
                                                   reduction='none')
        ((losses * weight).sum() / weight.sum()).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), tr.grad_clip_norm)
        opt.step()
  return run


def _paper(num_seeds=10, steps=_PER_CALL):
  """Memory, FLOPs and CPU time of one vmapped step of the paper preset."""
  config = copy_config.get_config('size=paper,encoding=rope')
  tx = make_optimizer(config.train)
  graphdef, states = _states(config, range(num_seeds), tx)
  stacked = _stack(states)
  state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(stacked))
  kw = dict(_step_kwargs(config), steps_per_call=1)
  fn = step_function(graphdef=graphdef, vmap_seeds=True, **kw)
  seeds = jnp.arange(num_seeds, dtype=jnp.int32)
  compiled = fn.lower(stacked, jnp.int32(0), seeds).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  memory = compiled.memory_analysis()
  stacked, m = fn(stacked, jnp.int32(0), seeds)  # warm-up
  jax.block_until_ready(m)
  times = []
  for step in range(1, steps + 1):
    start = time.perf_counter()
    stacked, m = fn(stacked, jnp.int32(step), seeds)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - start)
  return dict(num_seeds=num_seeds, state_bytes=int(state_bytes),
              flops_per_step=float(cost.get('flops', float('nan'))),
              temp_bytes=int(getattr(memory, 'temp_size_in_bytes', 0) or 0),
              cpu_step_s=statistics.median(times), num_steps=config.train.num_steps,
              num_layers=config.model.num_layers, batch_size=config.train.batch_size)


def main(argv):
  del argv
  config = copy_config.get_config()
  steps = _STEPS.value - _STEPS.value % _PER_CALL
  tokens_per_step = config.train.batch_size * tasks.tokens_read(
      tasks.get_task(config.task.name), config.task.train_max_length)
  results = []
  for num_seeds in (int(s) for s in _SEEDS.value):
    fns = _time_setup(config, num_seeds, steps)
    times = timing.interleaved({name: fn for name, (fn, _) in fns.items()}, _REPEATS.value)
    rate = {name: fns[name][1] * steps * tokens_per_step / statistics.median(ts)
            for name, ts in times.items()}
    for name, ts in times.items():
      results.append(dict(seeds=fns[name][1], impl=name, **timing.stats(ts),
                          tokens_per_s=rate[name],
                          speedup_vs_sequential=rate[name] / rate['sequential']))
  lines = [f'Training throughput, configs/copy.py default model ({config.model.encoding}, '
           f'd_model {config.model.d_model}, {config.model.num_layers} layers, batch '
           f'{config.train.batch_size}); {steps} steps per seed per timing, median of '
           f'{_REPEATS.value} interleaved repeats after a warm-up; backend '
           f'{jax.default_backend()}, {jax.device_count()} device(s).', '',
           '| seeds | implementation | s per timing, median (min–max) | tokens/s, all seeds '
           '| throughput vs sequential |', '|---|---|---|---|---|']
  for r in results:
    lines.append(f"| {r['seeds']} | {r['impl']} | {r['median_s']:.2f} ({r['min_s']:.2f}–"
                 f"{r['max_s']:.2f}) | {r['tokens_per_s']:,.0f} | "
                 f"{r['speedup_vs_sequential']:.2f} |")
  payload = dict(rows=results)
  if _PAPER.value:
    p = _paper()
    payload['paper'] = p
    lines += ['', f"Paper preset (configs/copy.py:size=paper, {p['num_layers']} layers, batch "
              f"{p['batch_size']}), {p['num_seeds']} seeds stacked: training state "
              f"{p['state_bytes'] / 2**20:.1f} MiB, XLA temporaries {p['temp_bytes'] / 2**20:.0f} MiB, "
              f"{p['flops_per_step'] / 1e9:.1f} GFLOP per vmapped step (XLA cost analysis), "
              f"{p['cpu_step_s'] * 1e3:.0f} ms per step on this machine: "
              f"{p['num_steps']} steps ≈ {p['num_steps'] * p['cpu_step_s'] / 60:.0f} min here; "
              f"at 100 TFLOP/s sustained it would be "
              f"{p['num_steps'] * p['flops_per_step'] / 1e14:.1f} s of compute."]
  write_report(_OUT.value, 'seeds', payload, lines)


if __name__ == '__main__':
  app.run(main)
