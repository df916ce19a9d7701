r"""Packed rows (`task.pack_segments`) against padding, side by side: the copy
study's train step, and the study's results.

  python -m benchmarks.packing [--calls=20] [--repeats=5] [--study_steps=1000] \
      [--study_encodings=rope,windowed_rope:coupled] [--out=benchmarks/results/packing]

Throughput: configs/copy.py's default model and data (RoPE, d_model 64, 2
layers, copy with inputs of 1–8), the lab's own compiled step
(`train.step.step_function`: batches made on device, 10 steps per call, as
the study runs it), --calls calls per timing, the rows interleaved
--repeats times after a warm-up (`timing.interleaved`):

  padding        one example per row, batch 32 rows of 18 tokens
  packed K=1     task.pack_segments=1: rows of the same 18 tokens, batch 32
  packed K=2     rows of 37 tokens, batch 16
  packed K=4     rows of 75 tokens, batch 8

Each row: ms per step (median, min–max), what a step holds (examples, real
tokens: not PAD, token slots), real tokens and examples per second, and the
ratios to padding. The rows have about the same token slots per step; what
packing changes is how many of them are real.

Results: the study (`run_study`, 3 seeds, --study_steps steps) on
--study_encodings twice, into fresh workdirs: padding (batch 32 rows) and
packed K=2 with batch 12 rows, about as many examples per step (31.5 on
average against 32) in 444 token slots instead of 576. Teacher-forced
token accuracy and exact match per entry at the lengths evaluated (mean ±
std over seeds; generation and the RoPE extensions off to save time), and
the largest |difference of means| in units of the seeds' spread. Writes
packing.json and packing.md into --out.
"""

import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags
from flax import nnx

from attention_jax.lab.config import facts
from attention_jax.lab import tasks
from attention_jax.lab.runs.study import run_study
from attention_jax.lab.train import make_optimizer
from attention_jax.lab.train.step import step_function
from attention_jax.lab.config.resolved import resolve
from benchmarks import timing
from benchmarks.report import write_report
from configs import copy as copy_config

_CALLS = flags.DEFINE_integer('calls', 20, 'Compiled calls (10 steps each) per timing.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed repeats per row.')
_STUDY_STEPS = flags.DEFINE_integer('study_steps', 1000, 'Training steps per study run; 0 = '
                                    'no study.')
_STUDY_ENCODINGS = flags.DEFINE_list('study_encodings', ['rope', 'windowed_rope:coupled'],
                                     'Entries of the study compared.')
_STUDY_LENGTHS = flags.DEFINE_list('study_lengths', ['1', '4', '8', '12', '16', '32'],
                                   'Input lengths the study evaluates.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results/packing', 'Output folder.')

# (label, task.pack_segments, train.batch_size): about the same token slots per step.
THROUGHPUT = (('padding', 0, 32), ('packed K=1', 1, 32), ('packed K=2', 2, 16),
              ('packed K=4', 4, 8))
# The study's packed setup: about as many examples per step as padding's 32.
STUDY = (('padding', 0, 32), ('packed K=2', 2, 12))
STEPS_PER_CALL = 10


def _config(pack_segments: int, batch_size: int):
  config = copy_config.get_config()
  config.task.pack_segments, config.train.batch_size = pack_segments, batch_size
  config.progress, config.train.tensorboard = False, False
  return config


def _contents(task, config, steps: int) -> dict:
  """Mean examples, real (non-PAD) input tokens and token slots per step
  over the training batches of steps 0 … steps-1 of seed 0."""
  batch_fn = jax.jit(lambda step: tasks.train_batch(
      task, 0, step, batch_size=config.train.batch_size,
      min_length=config.task.train_min_length, max_length=config.task.train_max_length,
      vocab_size=config.task.vocab_size))
  examples, real = [], []
  for step in range(steps):
    batch = jax.device_get(batch_fn(jnp.int32(step)))
    real.append(int(np.sum(batch['inputs'] != tasks.PAD)))
    if 'segment_ids' in batch:
      examples.append(sum(len(set(row[row > 0])) for row in batch['segment_ids']))
    else:
      examples.append(batch['inputs'].shape[0])
  return dict(examples=float(np.mean(examples)), real_tokens=float(np.mean(real)),
              slots=int(batch['inputs'].size))


def throughput_rows() -> list[dict]:
  runs, contents = {}, {}
  steps = _CALLS.value * STEPS_PER_CALL
  for label, pack_segments, batch_size in THROUGHPUT:
    config = _config(pack_segments, batch_size)
    task = facts.configured_task(config)
    model = resolve(config).build_model(0)
    graphdef, state = nnx.split((model, nnx.Optimizer(model, make_optimizer(config.train),
                                                      wrt=nnx.Param)))
    jitted = step_function(
        graphdef=graphdef, task=task, batch_size=batch_size,
        min_length=config.task.train_min_length, max_length=config.task.train_max_length,
        vocab_size=config.task.vocab_size, layout='decoder_only',
        steps_per_call=STEPS_PER_CALL)
    holder = [state]

    def run(jitted=jitted, holder=holder):
      s = holder[0]
      for call in range(_CALLS.value):
        s, _ = jitted(s, jnp.int32(call * STEPS_PER_CALL), jnp.int32(0))
      holder[0] = jax.block_until_ready(s)

    runs[label] = run
    contents[label] = _contents(task, config, steps)
  times = timing.interleaved(runs, _REPEATS.value)
  rows = []
  for label, ts in times.items():
    per_step = statistics.median(ts) / steps
    c = contents[label]
    rows.append(dict(label=label, ms_per_step=1e3 * per_step,
                     ms_min=1e3 * min(ts) / steps, ms_max=1e3 * max(ts) / steps, **c,
                     real_tokens_per_s=c['real_tokens'] / per_step,
                     examples_per_s=c['examples'] / per_step, times_s=ts))
  base = rows[0]
  for r in rows:
    r['time_ratio'] = r['ms_per_step'] / base['ms_per_step']
    r['real_tokens_per_s_ratio'] = r['real_tokens_per_s'] / base['real_tokens_per_s']
    r['examples_per_s_ratio'] = r['examples_per_s'] / base['examples_per_s']
    # The same ratio from each row's fastest repeat: under a shared machine's
    # load the fastest is the least disturbed.
    r['real_tokens_per_s_ratio_fastest'] = (r['real_tokens'] / r['ms_min']) / (
        base['real_tokens'] / base['ms_min'])
  return rows


def study_results() -> dict:
  """{label: (rows of results.csv, wall seconds)} of the two studies."""
  found = {}
  for label, pack_segments, batch_size in STUDY:
    config = _config(pack_segments, batch_size)
    config.study.encodings = tuple(_STUDY_ENCODINGS.value)
    config.train.num_steps = _STUDY_STEPS.value
    # The default's 100 warm-up steps, or a tenth of a shorter run.
    config.train.warmup_steps = min(config.train.warmup_steps, _STUDY_STEPS.value // 10)
    config.eval.update(lengths=tuple(int(n) for n in _STUDY_LENGTHS.value), generate=False,
                       rope_scalings=())
    start = time.perf_counter()
    rows = run_study(config, tempfile.mkdtemp(prefix='bench_packing_'), log=lambda _: None)
    found[label] = (rows, time.perf_counter() - start)
  return found


def _by_cell(rows: list[dict]) -> dict:
  """{(encoding, length): {metric: [per seed]}}."""
  cells = {}
  for r in rows:
    cell = cells.setdefault((r['encoding'], int(r['length'])), dict(token_accuracy=[],
                                                                     exact_match=[]))
    for metric in cell:
      cell[metric].append(float(r[metric]))
  return cells


def study_table(found: dict) -> tuple[list[str], dict]:
  (a, (rows_a, wall_a)), (b, (rows_b, wall_b)) = found.items()
  cells_a, cells_b = _by_cell(rows_a), _by_cell(rows_b)
  lines = [f'| entry | length | {a} token acc. | {b} token acc. | {a} exact | {b} exact | '
           '|Δ| / spread (token acc.) |', '|---|---|---|---|---|---|---|']
  worst = 0.0
  for key in sorted(cells_a):
    x, y = cells_a[key], cells_b[key]
    fmt = lambda v: f'{np.mean(v):.3f} ± {np.std(v):.3f}'
    spread = np.sqrt(np.var(x['token_accuracy']) + np.var(y['token_accuracy']))
    gap = abs(np.mean(x['token_accuracy']) - np.mean(y['token_accuracy']))
    units = gap / spread if spread > 0 else (0.0 if gap == 0 else float('inf'))
    worst = max(worst, units)
    lines.append(f'| {key[0]} | {key[1]} | {fmt(x["token_accuracy"])} | '
                 f'{fmt(y["token_accuracy"])} | {fmt(x["exact_match"])} | '
                 f'{fmt(y["exact_match"])} | {units:.2f} |')
  summary = dict(wall_s={a: wall_a, b: wall_b}, worst_gap_in_spreads=worst,
                 cells={f'{k[0]}@{k[1]}': dict(padding=cells_a[k], packed=cells_b[k])
                        for k in cells_a})
  return lines, summary


def main(argv):
  del argv
  rows = throughput_rows()
  lines = [f'Copy study train step (configs/copy.py default: RoPE, d_model 64, 2 layers, '
           f'inputs 1–8), {jax.devices()[0].platform}, {_CALLS.value * STEPS_PER_CALL} steps '
           f'per timing ({STEPS_PER_CALL} per compiled call), {_REPEATS.value} interleaved '
           'repeats.', '',
           '| setup | ms/step median (min–max) | examples/step | real tokens/step | slots/step '
           '| real tokens/s | × padding | × padding, fastest repeats | examples/s | × padding |',
           '|---|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    lines.append(f"| {r['label']} | {r['ms_per_step']:.2f} ({r['ms_min']:.2f}–"
                 f"{r['ms_max']:.2f}) | {r['examples']:.1f} | {r['real_tokens']:.0f} | "
                 f"{r['slots']} | {r['real_tokens_per_s']:,.0f} | "
                 f"{r['real_tokens_per_s_ratio']:.2f} | "
                 f"{r['real_tokens_per_s_ratio_fastest']:.2f} | {r['examples_per_s']:,.0f} | "
                 f"{r['examples_per_s_ratio']:.2f} |")
  payload = dict(platform=jax.devices()[0].platform, throughput=rows)
  if _STUDY_STEPS.value:
    found = study_results()
    table, summary = study_table(found)
    lines += ['', f'Study: {", ".join(_STUDY_ENCODINGS.value)} × seeds 0, 1, 2, '
              f'{_STUDY_STEPS.value} steps; padding batch 32 rows, packed K=2 batch 12 rows '
              '(about as many examples per step); teacher forcing; wall '
              + ', '.join(f'{k} {v:.0f} s' for k, v in summary['wall_s'].items()) + '.', '',
              *table, '',
              f'Largest |difference of means| / sqrt(var_a + var_b) of token accuracy: '
              f"{summary['worst_gap_in_spreads']:.2f}."]
    payload['study'] = dict(steps=_STUDY_STEPS.value, encodings=_STUDY_ENCODINGS.value,
                            setups=[dict(label=l, pack_segments=k, batch_size=b)
                                    for l, k, b in STUDY], **summary)
  write_report(_OUT.value, 'packing', payload, lines)


if __name__ == '__main__':
  app.run(main)
