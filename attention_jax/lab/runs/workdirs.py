"""Reading workdirs of every kind after the fact, for the follow-up tools
(`experiments.plot`, `experiments.attention_maps`).

Two kinds of workdir exist:

* a study (`experiments.length_extrapolation`): `results.csv`, `summary.md`
  and `TASK/LABEL/seedN/` (`runs/TASK/LABEL/seedN/` in the older layout,
  still read here), each run as below (an interrupted sweep may have the
  runs only);
* one run (`experiments.train`): `config.json`, `metrics.jsonl`, and once
  evaluated `results.csv` and `run.json`, at its top.

Nothing here writes; a folder that is neither kind is a `ConfigError` naming
it and what was expected, raised before any tool creates its output folder.
"""

import dataclasses
import json
import os
from typing import Callable, Optional, Sequence

import ml_collections

from attention_jax.lab.config import identity
from attention_jax.lab.report import plots
from attention_jax.lab.report import result_files
from attention_jax.lab.report import results
from attention_jax.lab.runs import plan
from attention_jax.lab.config.entries import run_label
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.runs.workdir_checks import MADE_BY
from attention_jax.lab.runs.workdir_checks import held

EXPECTED = ('a study workdir (results.csv or TASK/LABEL/seedN/, from '
            'experiments.length_extrapolation) or a run workdir (config.json and '
            'metrics.jsonl, from experiments.train)')
COMPARISON = 'comparison.md'


@dataclasses.dataclass
class Workdir:
  """What one workdir holds. `rows`: its result rows (results.csv's schema);
  `curves`: metrics.jsonl rows by run label ('TASK/LABEL/seedN');
  `train_range`: the training lengths (min, max), None if no config.json
  says (the union when its runs differ); `ceilings`: a study's ceiling.csv
  rows (`ambiguity.ceiling_rows`), empty without one."""
  path: str
  kind: str  # 'study' | 'run'
  rows: list[dict]
  curves: dict[str, list[dict]]
  train_range: Optional[tuple[int, int]]
  ceilings: list[dict] = dataclasses.field(default_factory=list)


def kind(path: str) -> str:
  """'study' or 'run' (see the module docstring); a `ConfigError` otherwise."""
  if not os.path.isdir(path):
    raise ConfigError(f'--workdir={path}: no such folder; expected {EXPECTED}.')
  found = held(path)
  if found == 'suite':
    raise ConfigError(f'--workdir={path} holds {MADE_BY["suite"]}: its results are the '
                      'results.csv, summary.md and chomsky.png in it; this tool reads '
                      f'{EXPECTED}.')
  if found is None:
    raise ConfigError(f'--workdir={path} holds neither; expected {EXPECTED}.')
  return found


def run_files(workdir: str, filename: str) -> list[str]:
  """`filename` of every run of a study workdir, in either layout."""
  return plan.run_directories(workdir, filename) + plan.run_directories(
      os.path.join(workdir, 'runs'), filename)


def metric_rows(path: str) -> list[dict]:
  """metrics.jsonl's rows, without a last line cut short by a killed run."""
  rows = []
  with open(path) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return rows


def study_rows(workdir: str) -> list[dict]:
  """The study's results.csv rows; for an interrupted sweep, those of its
  runs. A run retrained under another config (`--config.study.on_mismatch=
  retrain` writes `seedN-K` beside `seedN`) holds another model: its rows are
  labelled `ENCODING (retrain K)`, never averaged with the first ones."""
  path = os.path.join(workdir, 'results.csv')
  if os.path.exists(path):
    return _read_rows(path)
  rows = []
  for path in run_files(workdir, 'results.csv'):
    _, _, retrain = os.path.basename(os.path.dirname(path)).partition('-')
    suffix = f' (retrain {retrain})' if retrain else ''
    rows += [dict(r, encoding=r['encoding'] + suffix) for r in _read_rows(path)]
  return rows


def _read_rows(path: str) -> list[dict]:
  try:
    return result_files.read_rows(path)
  except (ValueError, KeyError) as e:
    raise ConfigError(f'{path} is not a readable results.csv ({e}).') from None


def _read_ceilings(workdir: str) -> list[dict]:
  """`workdir`'s ceiling.csv rows, typed; [] if it has none."""
  path = os.path.join(workdir, 'ceiling.csv')
  if not os.path.exists(path):
    return []
  try:
    rows = result_files.read_table(path, result_files.CEILING_FIELDS,
                              dict(length=int, k=int, unambiguous=float), 'a ceiling table')
  except ValueError as e:
    raise ConfigError(f'{path} is not a readable ceiling.csv ({e}).') from None
  return [{k: r[k] for k in result_files.CEILING_FIELDS} for r in rows]


def _range(configs: Sequence[ml_collections.ConfigDict]) -> Optional[tuple[int, int]]:
  ranges = {(c.task.train_min_length, c.task.train_max_length) for c in configs}
  if not ranges:
    return None
  return min(lo for lo, _ in ranges), max(hi for _, hi in ranges)


def read(path: str) -> Workdir:
  """Everything the follow-up tools draw from one workdir of either kind."""
  found = kind(path)
  if found == 'run':
    config = identity.read_config(path)
    if config is None:
      raise ConfigError(f'--workdir={path}: config.json is not readable; expected {EXPECTED}.')
    metrics = os.path.join(path, 'metrics.jsonl')
    curves = {}
    if os.path.exists(metrics):
      curves[f'{config.task.name}/{run_label(config)}/seed{config.train.seed}'] = (
          metric_rows(metrics))
    table = os.path.join(path, 'results.csv')
    rows = _read_rows(table) if os.path.exists(table) else []
    configs = [config]
  else:
    rows = study_rows(path)
    curves = {}
    for metrics in run_files(path, 'metrics.jsonl'):
      task, label, seed = metrics.split(os.sep)[-4:-1]
      curves[f'{task}/{label}/{seed}'] = metric_rows(metrics)
    run_dirs = [os.path.dirname(p) for p in run_files(path, 'config.json')]
    configs = [c for c in map(identity.read_config, [path] + run_dirs) if c is not None]
  if not rows and not curves:
    raise ConfigError(f'--workdir={path} holds no results.csv or metrics.jsonl yet; expected '
                      f'{EXPECTED}.')
  return Workdir(path, found, rows, curves, _range(configs), _read_ceilings(path))


def names(paths: Sequence[str]) -> list[str]:
  """Short, distinct labels: each workdir's last folder, or its whole path
  where two last folders are equal."""
  short = [os.path.basename(os.path.normpath(p)) for p in paths]
  return [s if short.count(s) == 1 else os.path.normpath(p) for s, p in zip(short, paths)]


def redraw(paths: Sequence[str], out: Optional[str] = None,
           log: Callable[[str], None] = print) -> list[str]:
  """Draws extrapolation.png and training_curves.png from `paths` (any mix
  of kinds, in any order) into `out` (default: the one workdir, or the
  current folder for several); with exactly two workdirs, also the
  comparison table (`results.comparison_markdown`, second minus first),
  printed and written to comparison.md. Every workdir is read before `out`
  is created. Returns the files written."""
  read_all = [read(p) for p in paths]
  labels = names(paths) if len(paths) > 1 else ['']
  out = out or (paths[0] if len(paths) == 1 else '.')
  rows, curves, ranges = [], {}, {}
  for w, name in zip(read_all, labels):
    rows += [dict(r, source=name) for r in w.rows]
    curves.update({f'{name}:{k}' if name else k: v for k, v in w.curves.items()})
    ranges[name] = w.train_range
    if w.rows and w.train_range is None:
      log(f'{w.path}: no config.json says the training lengths; they are not shaded.')
  os.makedirs(out, exist_ok=True)
  written = []
  if rows:
    written.append(os.path.join(out, 'extrapolation.png'))
    # One workdir's ceilings as its own figure shows them; several may differ.
    ceilings = read_all[0].ceilings if len(read_all) == 1 else ()
    plots.plot_extrapolation(rows, written[-1], train_ranges=ranges, ceilings=ceilings)
  if curves:
    written.append(os.path.join(out, 'training_curves.png'))
    plots.plot_training_curves(curves, written[-1])
  if len(read_all) == 2:
    (a, b), (name_a, name_b) = read_all, labels
    if a.train_range and b.train_range and a.rows and b.rows:
      table = results.comparison_markdown(a.rows, b.rows, names=(name_a, name_b),
                                          train_max=(a.train_range[1], b.train_range[1]))
      written.append(os.path.join(out, COMPARISON))
      result_files.write_text(written[-1], table)
      log(table)
    else:
      log(f'no comparison table: {name_a} and {name_b} both need results.csv and config.json.')
  return written
