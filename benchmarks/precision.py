r"""bfloat16 against float32, side by side: the attention layer and a small LM's train step.

  python -m benchmarks.precision [--lengths=1024] [--batch=4] [--repeats=5] \
      [--out=benchmarks/results]

Rows, each compiled once and warmed up, then timed interleaved (A B A B …)
--repeats times; medians, min–max, and the ratio bf16 / f32 (below 1: bf16
is faster):

  attention   `MultiHeadAttention` (d_model 512, 8 heads, causal,
              implementation 'auto'), forward + backward of sum(out · g) at
              each --lengths T, batch --batch
  train_step  `TransformerLM` at configs/copy.py's size (RoPE, d_model 64,
              4 heads, 2 layers, MLP 256, batch 32 sequences of 18 tokens,
              20 token ids), forward, backward and one AdamW update

f32 is `dtype=None` (float32 parameters: Flax's inference computes in
float32); bf16 is `dtype=jnp.bfloat16, param_dtype=jnp.float32` (bfloat16
compute, float32 master weights). Both start from the same parameters and
their outputs are checked close before timing. A CPU without bfloat16
matrix units gains little (XLA:CPU may widen bfloat16 around a matmul);
the accelerator run is the one that shows what bfloat16 buys. Writes
precision.json and precision.md into --out.
"""

import statistics

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app
from absl import flags
from flax import nnx

import attention_jax as aj
from benchmarks.report import interleaved_times
from benchmarks.report import write_report
from configs import copy as copy_config

_LENGTHS = flags.DEFINE_list('lengths', ['1024'], 'Attention lengths T.')
_BATCH = flags.DEFINE_integer('batch', 4, 'Attention batch.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed calls per row.')
_STEPS = flags.DEFINE_integer('steps', 10, 'Train steps per timed call.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Output folder.')

D_MODEL, HEADS = 512, 8
PRECISIONS = {'f32': dict(), 'bf16': dict(dtype=jnp.bfloat16, param_dtype=jnp.float32)}
# Special tokens (BOS, SEP, EOS, PAD) on top of the copy task's 16 symbols.
SPECIAL_TOKENS = 4


def attention_runs(t: int) -> dict:
  """{precision: (run, output)}: fwd+bwd of one attention layer at length t."""
  x = jax.random.normal(jax.random.key(0), (_BATCH.value, t, D_MODEL))
  g = jax.random.normal(jax.random.key(1), x.shape)
  runs = {}
  for name, precision in PRECISIONS.items():
    mha = aj.MultiHeadAttention(D_MODEL, HEADS, causal=True, rngs=nnx.Rngs(0), **precision)
    graphdef, params = nnx.split(mha)

    @jax.jit
    def step(params, x, g, graphdef=graphdef):
      def loss(params, x):
        out = nnx.merge(graphdef, params)(x)
        return jnp.sum(out.astype(jnp.float32) * g), out
      (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, x)
      return out, grads

    runs[name] = (lambda step=step, params=params: jax.block_until_ready(step(params, x, g)),
                  lambda step=step, params=params: step(params, x, g)[0])
  return runs


def train_step_runs() -> dict:
  """{precision: (run, output)}: --steps AdamW steps of configs/copy.py's model."""
  config = copy_config.get_config()
  m = config.model
  vocab = config.task.vocab_size + SPECIAL_TOKENS
  length = 2 * config.task.train_max_length + 2
  tokens = jax.random.randint(jax.random.key(2), (config.train.batch_size, length), 0, vocab)
  runs = {}
  for name, precision in PRECISIONS.items():
    model = aj.TransformerLM(vocab_size=vocab, d_model=m.d_model, num_heads=m.num_heads,
                             num_layers=m.num_layers, mlp_dim=m.mlp_dim, encoding='rope',
                             rngs=nnx.Rngs(0), **precision)
    optimizer = nnx.Optimizer(model, optax.adamw(config.train.learning_rate), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))

    def loss_fn(model, tokens):
      logits = model(tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    @jax.jit
    def steps(state, tokens, graphdef=graphdef):
      def body(_, carry):
        model, optimizer = nnx.merge(graphdef, carry[0])
        loss, grads = nnx.value_and_grad(loss_fn)(model, tokens)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss
      state, loss = jax.lax.fori_loop(0, _STEPS.value, body, (state, jnp.float32(0)))
      return loss, state

    runs[name] = (lambda steps=steps, state=state: jax.block_until_ready(steps(state, tokens)),
                  lambda steps=steps, state=state: steps(state, tokens)[0])
  return runs


def timed(label: str, runs: dict, atol: float) -> list[dict]:
  """Checks the outputs close, warms up, times interleaved; one row per precision."""
  outputs = {name: np.asarray(output(), np.float32) for name, (_, output) in runs.items()}
  np.testing.assert_allclose(outputs['bf16'], outputs['f32'], atol=atol, rtol=0,
                             err_msg=label)
  times = interleaved_times({name: run for name, (run, _) in runs.items()}, _REPEATS.value)
  base = statistics.median(times['f32'])
  return [dict(case=label, precision=name, median_s=statistics.median(ts), min_s=min(ts),
               max_s=max(ts), ratio_to_f32=statistics.median(ts) / base)
          for name, ts in times.items()]


def main(argv):
  del argv
  rows = []
  for t in (int(v) for v in _LENGTHS.value):
    # bfloat16 keeps 8 significant bits: outputs of size ~1 within a few 1e-2.
    rows += timed(f'attention T={t}', attention_runs(t), atol=0.1)
  rows += timed(f'train_step ×{_STEPS.value}', train_step_runs(), atol=0.1)
  lines = [f'bf16 (dtype=bfloat16, param_dtype=float32) vs f32, {jax.devices()[0].platform}, '
           f'{_REPEATS.value} repeats, interleaved', '',
           '| case | precision | median s (min–max) | × f32 |', '|---|---|---|---|']
  for r in rows:
    lines.append(f"| {r['case']} | {r['precision']} | {r['median_s']:.4f} "
                 f"({r['min_s']:.4f}–{r['max_s']:.4f}) | {r['ratio_to_f32']:.2f} |")
  write_report(_OUT.value, 'precision', dict(rows=rows, platform=jax.devices()[0].platform),
               lines)


if __name__ == '__main__':
  app.run(main)
