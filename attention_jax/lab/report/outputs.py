"""A study's outputs: results.csv, summary.md, ceiling.csv and the figure.

Written from finished runs only (`lab.runs.study` calls `write_study_outputs`
once every run of the sweep is done), so every output of a workdir covers
the same runs: this sweep's and earlier ones' that match its config
(`other_runs`). `ceiling.csv` is the task's own limit on the very strings
the models were evaluated on (`evaluate.ambiguity`): per task, length and k,
the fraction of strings a k-gram lookup can copy at all.
"""

import os
from typing import Optional, Sequence

import ml_collections

from attention_jax.lab.evaluate import grid
from attention_jax.lab.config import identity
from attention_jax.lab.runs import one_study
from attention_jax.lab.runs import plan
from attention_jax.lab.report import result_files
from attention_jax.lab.report import results
from attention_jax.lab import tasks
from attention_jax.lab.evaluate import ambiguity
from attention_jax.lab.evaluate import hard
from attention_jax.lab.report import hard_report
from attention_jax.lab.evaluate import bucket_floor
from attention_jax.lab.evaluate import eval_lengths
from attention_jax.lab.report.plots import plot_extrapolation
from attention_jax.lab.report.plots import plot_grid


def other_runs(workdir: str, config: ml_collections.ConfigDict, runs: list):
  """Rows of the workdir's finished runs outside this sweep's planned `runs`
  that match its config (as trained and as evaluated), and the coverage
  lists for summary.md: (covered, earlier, excluded)."""
  rel = lambda d: os.path.relpath(d, workdir)
  swept = {os.path.abspath(r.directory) for r in runs}
  rows, earlier, excluded = [], [], []
  for path in plan.run_directories(workdir, 'results.csv'):
    run_dir = os.path.dirname(path)
    if os.path.abspath(run_dir) in swept:
      continue
    stored = identity.read_config(run_dir)
    if stored is None:
      excluded.append((rel(run_dir), 'no readable config.json'))
      continue
    candidate = one_study.candidate(config, stored)
    diffs = identity.differences(stored, candidate)
    found = None if diffs else identity.evaluated_rows(run_dir, candidate)
    if diffs:
      excluded.append((rel(run_dir), 'trained with other ' + ', '.join(k for k, _, _ in diffs[:3])))
    elif found is None:
      excluded.append((rel(run_dir), 'evaluated with other eval settings'))
    else:
      rows += found
      earlier.append(rel(run_dir))
  return rows, ([rel(r.directory) for r in runs] + earlier, earlier, excluded)


def task_ceilings(config: ml_collections.ConfigDict, task_names: Sequence[str]) -> list[dict]:
  """`ambiguity.ceiling_rows` for each task, on the config's evaluation strings."""
  e = config.eval
  return [row for name in task_names if tasks.get_task(name).ceiling
          for row in ambiguity.ceiling_rows(
              tasks.get_task(name), eval_lengths(config),
              train_max=bucket_floor(config, eval_lengths(config)),
              num_samples=e.num_samples, vocab_size=config.task.vocab_size, eval_seed=e.seed,
              batch_size=e.batch_size)]


def _per_run(run_dirs: Sequence[str], path_of, read) -> list[dict]:
  """The rows of each run's table at `path_of(run_dir)`, where it has one."""
  return [row for path in map(path_of, run_dirs) if os.path.exists(path) for row in read(path)]


def grid_rows(run_dirs: Sequence[str]) -> list[dict]:
  """The rows of each run's grid.csv (`evaluate.grid`), where it has one."""
  return _per_run(run_dirs, grid.run_grid_path, grid.read_grid)


def hard_rows(run_dirs: Sequence[str]) -> list[dict]:
  """The rows of each run's hard.csv (`evaluate.hard`), where it has one."""
  return _per_run(run_dirs, hard.run_hard_path, hard.read_hard)


def write_study_outputs(rows, workdir: str, config: ml_collections.ConfigDict,
                        coverage: Optional[tuple] = None,
                        grid_table: Sequence[dict] = (),
                        hard_table: Sequence[dict] = ()) -> list[dict]:
  """results.csv, ceiling.csv, summary.md (with the ceiling, and with
  `coverage`, `other_runs`' lists, saying which runs it covers) and
  extrapolation.png (the ceiling dashed under exact match); with
  `grid_table` (`grid_rows`), grid.csv and TASK_grid.png too; with
  `hard_table` (`hard_rows`), hard.csv, results.csv's hard_exact_match
  column and the hard-case tables; the text files atomically. Returns the
  rows written to results.csv."""
  t = config.task
  task_names = sorted({r['task'] for r in rows})
  ceilings = task_ceilings(config, task_names)
  rows = hard_report.with_hard(rows, hard_table)
  if hard_table:
    hard.write_hard(os.path.join(workdir, hard.HARD_FILE), hard_table)
  result_files.write_rows(os.path.join(workdir, 'results.csv'), rows)
  result_files.write_ceiling(os.path.join(workdir, 'ceiling.csv'), ceilings)
  summary = results.summary_markdown(
      rows, t.train_min_length, t.train_max_length,
      hard_sets={name: getattr(tasks.TASKS.get(name), 'hard_set', '') for name in task_names})
  if hard_table:
    summary += '\n' + hard_report.hard_markdown(hard_table, rows)
  summary += '\n' + results.ceiling_markdown(ceilings, t.train_max_length)
  if grid_table:
    grid.write_grid(os.path.join(workdir, 'grid.csv'), grid_table)
    summary += '\n' + grid.grid_markdown(grid_table, t.train_max_length)
    plot_grid(grid_table, os.path.join(workdir, grid.figure_name(grid_table)),
              train_max=t.train_max_length)
  if coverage:
    summary += '\n' + '\n'.join(results.coverage_summary(*coverage))
  result_files.write_text(os.path.join(workdir, 'summary.md'), summary)
  plot_extrapolation(rows, os.path.join(workdir, 'extrapolation.png'),
                     train_min=t.train_min_length, train_max=t.train_max_length,
                     ceilings=ceilings)
  return rows
