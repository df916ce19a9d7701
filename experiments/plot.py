r"""Redraw figures from finished (or partly finished) workdirs, after the fact.

  python -m experiments.plot --workdir=runs/copy [--workdir=runs/other ...] \
      [--out=DIR]

Reads only files: each workdir's results.csv (or, for an interrupted sweep,
its runs/*/*/seed*/results.csv) and runs' metrics.jsonl. Writes
extrapolation.png and training_curves.png into --out (default: the single
workdir, or the current folder for several). With several workdirs, lines are
labelled `workdir:encoding`.
"""

import glob
import json
import os

from absl import app
from absl import flags

from attention_jax.lab import plots
from attention_jax.lab import results

_WORKDIRS = flags.DEFINE_multi_string('workdir', None, 'Workdir(s) to read.', required=True)
_OUT = flags.DEFINE_string('out', None, 'Where to write the figures.')


def _rows(workdir):
  """The workdir's results.csv rows; for an interrupted sweep, those of its
  runs. A run retrained under another config (`--config.study.on_mismatch=
  retrain` writes `seedN-K` beside `seedN`) holds another model: its rows are
  labelled `ENCODING (retrain K)`, never averaged with the first ones."""
  path = os.path.join(workdir, 'results.csv')
  if os.path.exists(path):
    return results.read_rows(path)
  rows = []
  for path in sorted(glob.glob(os.path.join(workdir, 'runs', '*', '*', 'seed*', 'results.csv'))):
    _, _, retrain = os.path.basename(os.path.dirname(path)).partition('-')
    suffix = f' (retrain {retrain})' if retrain else ''
    rows += [dict(r, encoding=r['encoding'] + suffix) for r in results.read_rows(path)]
  return rows


def _metric_rows(path):
  """metrics.jsonl's rows, without a last line cut short by a killed run."""
  rows = []
  with open(path) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return rows


def _train_range(workdir):
  for path in glob.glob(os.path.join(workdir, 'runs', '*', '*', 'seed*', 'config.json')):
    with open(path) as f:
      task = json.load(f)['task']
    return task['train_min_length'], task['train_max_length']
  raise ValueError(f'{workdir}: no runs/*/*/seed*/config.json to read the training lengths from.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  workdirs = _WORKDIRS.value
  out = _OUT.value or (workdirs[0] if len(workdirs) == 1 else '.')
  rows, curves = [], {}
  for workdir in workdirs:
    prefix = f'{os.path.basename(os.path.normpath(workdir))}:' if len(workdirs) > 1 else ''
    rows += [dict(r, encoding=prefix + r['encoding']) for r in _rows(workdir)]
    for path in sorted(glob.glob(os.path.join(workdir, 'runs', '*', '*', 'seed*', 'metrics.jsonl'))):
      task, label, seed = path.split(os.sep)[-4:-1]
      curves[f'{prefix}{task}/{label}/{seed}'] = _metric_rows(path)
  if not rows and not curves:
    raise app.UsageError(f'no results.csv or metrics.jsonl under {workdirs}.')
  os.makedirs(out, exist_ok=True)
  if rows:
    train_min, train_max = _train_range(workdirs[0])
    plots.plot_extrapolation(rows, os.path.join(out, 'extrapolation.png'),
                             train_min=train_min, train_max=train_max)
  if curves:
    plots.plot_training_curves(curves, os.path.join(out, 'training_curves.png'))
  print(f'wrote figures to {out}')


if __name__ == '__main__':
  app.run(main)
