r"""The study's wall time: one setup after another vs the fast path, one run.

  python -m benchmarks.study [--encodings=alibi,rope,hard_alibi,windowed_rope:coupled] \
      [--steps=2000] [--out=benchmarks/results]

Runs `configs/copy.py`'s default study (3 seeds, training, evaluation at
every default length, generation, RoPE's context extensions) restricted to
--encodings, twice into fresh workdirs:

  sequential     `study.vmap_seeds=False`, `study.parallel_setups=1`: every
                 run trained and evaluated alone, one after another
  fast           the defaults: the seeds of a setup in one vmapped program,
                 two setups side by side in threads

and reports each mode's wall time, the sum of the runs' time_breakdown
(train, evaluation, generation, and the XLA compile seconds in each), the
speed-up, and whether both wrote the same accuracies (they must, to 1e-6).
Writes study.json and study.md into --out. Run it alone on the machine.
"""

import json
import os
import tempfile
import time

from absl import app
from absl import flags

from attention_jax.lab.runs.study import run_study
from benchmarks.report import write_report
from configs import copy as copy_config

_ENCODINGS = flags.DEFINE_list('encodings', ['alibi', 'rope', 'hard_alibi',
                                             'windowed_rope:coupled'], 'Encodings swept.')
_STEPS = flags.DEFINE_integer('steps', 2000, 'Training steps per run.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Output folder.')
_MODES = {'sequential': dict(vmap_seeds=False, parallel_setups=1),
          'fast': dict(vmap_seeds=True, parallel_setups=2)}
_STAGES = ('train', 'evaluation', 'generation')


def _run(mode: dict) -> tuple[float, list[dict], dict]:
  config = copy_config.get_config()
  config.study.encodings = tuple(_ENCODINGS.value)
  config.train.num_steps = _STEPS.value
  config.study.update(mode)
  config.progress = False
  workdir = tempfile.mkdtemp(prefix='bench_study_')
  start = time.perf_counter()
  rows = run_study(config, workdir, log=lambda _: None)
  wall = time.perf_counter() - start
  totals = dict.fromkeys([s for k in _STAGES for s in (k, f'{k}_compile')], 0.0)
  for root, _, files in os.walk(workdir):
    if 'run.json' in files:
      with open(os.path.join(root, 'run.json')) as f:
        times = json.load(f)['time_breakdown']
      for key in totals:
        totals[key] += times.get(key, 0.0)
  return wall, rows, totals


def main(argv):
  del argv
  results = {name: _run(mode) for name, mode in _MODES.items()}
  (base, base_rows, _), (_, fast_rows, _) = results['sequential'], results['fast']
  worst = max(abs(a[k] - b[k]) for a, b in zip(base_rows, fast_rows)
              for k in ('token_accuracy', 'exact_match'))
  same_cells = [(a['encoding'], a['seed'], a['length']) for a in base_rows] == [
      (b['encoding'], b['seed'], b['length']) for b in fast_rows]
  lines = [f'The default study on {", ".join(_ENCODINGS.value)} (3 seeds, {_STEPS.value} '
           'steps, every default length, generation), both modes in one run, fresh workdirs.',
           '',
           '| mode | wall s | speed-up | train s (compile) | evaluation s (compile) | '
           'generation s (compile) |',
           '|---|---|---|---|---|---|']
  payload = dict(encodings=_ENCODINGS.value, steps=_STEPS.value, modes={},
                 max_accuracy_difference=worst, same_cells=same_cells)
  for name, (wall, _, totals) in results.items():
    payload['modes'][name] = dict(wall_s=wall, speedup=base / wall, **totals)
    lines.append(f'| {name} | {wall:.0f} | {base / wall:.2f} | ' + ' | '.join(
        f"{totals[k]:.0f} ({totals[k + '_compile']:.0f})" for k in _STAGES) + ' |')
  lines += ['', 'Stage seconds are summed over runs, each run charged its share of a '
            'program it shared; side by side, two setups\' stages overlap in wall time.',
            f'Largest accuracy difference between the modes: {worst:.2e} '
            f'(same cells: {same_cells}).']
  write_report(_OUT.value, 'study', payload, lines)


if __name__ == '__main__':
  app.run(main)
