"""What an evaluated run directory records: `results.csv` and `run.json`.

`run.json` holds the timings, the final training metrics, the config the
model was trained and evaluated with and its evaluation fields (when they
match a config's, the run is finished: `identity.evaluated_rows`), and, for
a run trained longer than first planned, its `extensions` (`identity`'s
record, copied so that the file a reader opens first says so).
"""

import json
import os

from attention_jax.lab.config import identity
from attention_jax.lab.report import result_files
from attention_jax.lab.evaluate.grid import run_grid_path
from attention_jax.lab.evaluate.grid import write_grid


def write_run(config, run_dir, rows, last, times, timings, trained_with, grid=None) -> None:
  """results.csv (and grid.csv with `grid`, `evaluate.grid`'s rows) and
  run.json of one evaluated run, atomically. `times`:
  this run's share of the seconds per stage (`Stopwatch.breakdown`: train,
  evaluation, generation, each with its XLA compile time), `timings` per
  evaluation variant."""
  times = dict(times)
  info = dict(train_seconds=times['train'], trained_with_seeds=trained_with,
              final_train_metrics=last)
  if not last:  # nothing trained this time: keep what the training run recorded
    info.update(_read_json(os.path.join(run_dir, 'run.json'), info))
    old = info.pop('time_breakdown', {})
    times.update({k: old[k] for k in ('train', 'train_compile') if k in old})
  info.update(eval_seconds=times.get('evaluation', 0.0) + times.get('generation', 0.0),
              time_breakdown=times, eval_breakdown=timings, config=config.to_dict(),
              evaluation=identity.evaluation_fields(config))
  diverged = next((r['diverged_at'] for r in rows if r.get('diverged_at') is not None), None)
  if diverged is not None:  # `train.divergence`: said where a reader looks first
    info.update(diverged_at=diverged)
  grown = identity.extensions(run_dir)
  if grown:  # only then: the run.json of a run never extended stays as it was
    info.update(extensions=grown)
  # results.csv (and grid.csv) first: a stop in between leaves an old
  # run.json, which means "evaluate again", never stale results taken as current.
  if grid is not None:
    write_grid(run_grid_path(run_dir), grid)
  result_files.write_rows(os.path.join(run_dir, 'results.csv'), rows)
  result_files.write_text(os.path.join(run_dir, 'run.json'), json.dumps(info, indent=1, default=str))


def _read_json(path: str, default: dict) -> dict:
  try:
    with open(path) as f:
      old = json.load(f)
    return {k: old[k] for k in ('train_seconds', 'trained_with_seeds', 'final_train_metrics',
                                'time_breakdown') if k in old}
  except (OSError, ValueError):
    return default
