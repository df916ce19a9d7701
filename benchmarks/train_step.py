r"""The study's train step: ours vs the same model in PyTorch eager, side by side.

  pip install -r requirements-bench.txt
  python -m benchmarks.train_step [--steps=1000] [--repeats=5] [--out=benchmarks/results]

The model and batch are configs/copy.py's default (RoPE, d_model 64, 4 heads,
2 layers, MLP 256, batch 32 sequences of 18 tokens). PyTorch's twin has the
same architecture (pre-LN, GELU-tanh MLP, split-halves RoPE, untied output),
our initial weights and AdamW + clipping; both losses on one batch are checked
equal before timing. Rows, each timed over --steps steps, interleaved A B C D …
--repeats times after a warm-up:

  ours-train-loop   `attention_jax.lab.train.train` itself (10 steps per compiled call,
                    data made on device,
                    metrics fetched every log_every steps, progress bar off)
  ours-1-step-calls the compiled step with one step per call, from a bare loop
  ours-fused        --steps steps in ONE compiled program (lax.fori_loop): no
                    Python at all between steps, the floor for our step
  pytorch-eager     forward, backward, clip, AdamW step per step (the batch
                    made once, outside the timing: an advantage for PyTorch)

Python overhead of our loop = (train-loop − fused) / train-loop.
Writes train_step.json and train_step.md into --out.
"""

import statistics

import jax
import jax.numpy as jnp
import numpy as np
import torch
from absl import app
from absl import flags
from flax import nnx

from attention_jax.lab import tasks
from attention_jax.lab.train import loop
from attention_jax.lab.train import make_optimizer
from attention_jax.lab.protocols import decoder
from attention_jax.lab.evaluate.scoring import masked_metrics
from attention_jax.lab.train.step import step_function
from attention_jax.lab.train.step import train_step
from attention_jax.lab.config.resolved import resolve
from benchmarks import timing
from benchmarks.report import write_report
from benchmarks.torch_lm import TorchLM
from configs import copy as copy_config

_STEPS = flags.DEFINE_integer('steps', 1000, 'Steps per timed call.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed calls per row.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Output folder.')


def main(argv):
  del argv
  torch.manual_seed(0)
  config = copy_config.get_config()
  config.progress, config.train.tensorboard = False, False
  m, tr, steps = config.model, config.train, _STEPS.value
  model = resolve(config).build_model(0)
  task = tasks.get_task(config.task.name)
  batch_kw = dict(batch_size=tr.batch_size, min_length=config.task.train_min_length,
                  max_length=config.task.train_max_length, vocab_size=config.task.vocab_size)
  batch = tasks.train_batch(task, 0, jnp.int32(0), **batch_kw)
  tokens_per_step = int(batch['inputs'].size)

  net = TorchLM(config.task.vocab_size + tasks.NUM_SPECIAL, m.d_model, m.num_heads,
                m.num_layers, m.mlp_dim)
  net.load(model)
  inputs, targets = (torch.from_numpy(np.asarray(batch[k]).astype(np.int64))
                     for k in ('inputs', 'targets'))
  weight = torch.from_numpy(np.asarray(batch['loss_mask']).astype(np.float32))

  def torch_loss():
    logits = net(inputs)
    losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction='none')
    return (losses * weight).sum() / weight.sum()

  ours_loss = float(masked_metrics(decoder.forward_batch(model, batch), batch)['loss'])
  np.testing.assert_allclose(torch_loss().item(), ours_loss, rtol=1e-5)  # same model first
  opt = torch.optim.AdamW(net.parameters(), lr=tr.learning_rate, betas=(tr.adam_b1, tr.adam_b2),
                          weight_decay=tr.weight_decay)

  def pytorch_eager():
    for _ in range(steps):
      opt.zero_grad(set_to_none=True)
      torch_loss().backward()
      torch.nn.utils.clip_grad_norm_(net.parameters(), tr.grad_clip_norm)
      opt.step()

  def train_loop():
    c = config.copy_and_resolve_references()
    c.train.num_steps = steps
    loop.train(c, None, progress=False, tx=tx)

  tx = make_optimizer(tr)
  graphdef, state = nnx.split((model, nnx.Optimizer(model, tx, wrt=nnx.Param)))
  jitted = step_function(graphdef=graphdef, task=task, layout='decoder_only', **batch_kw)
  seed = jnp.int32(0)
  step_fn = lambda s, i: jitted(s, i, seed)
  holder = [state]

  def dispatch():
    s = holder[0]
    for i in range(steps):
      s, _ = step_fn(s, np.int32(i))
    holder[0] = jax.block_until_ready(s)

  @jax.jit
  def fused(s):
    def body(i, s):
      b = tasks.train_batch(task, 0, i, **batch_kw)
      return train_step(graphdef, s, b)[0]
    return jax.lax.fori_loop(0, steps, body, s)

  fused_state = [jax.tree.map(jnp.copy, state)]

  def run_fused():
    fused_state[0] = jax.block_until_ready(fused(fused_state[0]))

  rows_fns = {'ours-train-loop': train_loop, 'ours-1-step-calls': dispatch,
              'ours-fused': run_fused, 'pytorch-eager': pytorch_eager}
  times = timing.interleaved(rows_fns, _REPEATS.value)
  ratio = timing.ratios(times, 'pytorch-eager')
  rows = []
  for name, ts in times.items():
    med = statistics.median(ts)
    rows.append(dict(impl=name, **timing.stats(ts), ms_per_step=1e3 * med / steps,
                     tokens_per_s=tokens_per_step * steps / med, ratio_to_pytorch=ratio[name]))
  loop_s = statistics.median(times['ours-train-loop'])
  overhead = (loop_s - statistics.median(times['ours-fused'])) / loop_s
  lines = [f'Study train step (configs/copy.py default: {m.encoding}, d_model {m.d_model}, '
           f'{m.num_layers} layers, batch {tr.batch_size} × {batch["inputs"].shape[1]} tokens), '
           f'{steps} steps per timing, {_REPEATS.value} interleaved repeats; torch threads '
           f'{torch.get_num_threads()}.', '',
           '| implementation | ms/step median (min–max) | tokens/s | time × PyTorch |',
           '|---|---|---|---|']
  for r in rows:
    lines.append(f"| {r['impl']} | {r['ms_per_step']:.2f} ({1e3 * r['min_s'] / steps:.2f}–"
                 f"{1e3 * r['max_s'] / steps:.2f}) | {r['tokens_per_s']:,.0f} | "
                 f"{r['ratio_to_pytorch']:.2f} |")
  lines += ['', f'Python overhead of our training loop: {100 * overhead:.1f}% of step time '
            '((train-loop − fused) / train-loop).']
  write_report(_OUT.value, 'train_step', dict(rows=rows, python_overhead=overhead), lines)


if __name__ == '__main__':
  app.run(main)
