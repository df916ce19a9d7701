"""The benchmark a config runs, chosen by its protocol: `config.protocol`
'decoder' is the length-extrapolation study (`runs.study`: a causal decoder,
teacher-forced and generated), 'encoder' DeepMind's suite (`runs.suite`:
blank output slots). Both run under the one runner (`runs.runner`), so the
entry points that run a benchmark take a config of either protocol:

  python -m experiments.length_extrapolation --config=chomsky:scale=tiny --workdir=runs/tiny

What the entry point then shows is the same for both: `Finished`, and the
whole command is `run_command`.
"""

import dataclasses
import glob
import os
import sys
from typing import Callable, Optional

import ml_collections

from attention_jax.lab.config.command_line import check_study_overrides
from attention_jax.lab.config.presets import check_protocol_fields
from attention_jax.lab.config.presets import protocol_of
from attention_jax.lab.report import suite_report
from attention_jax.lab.runs.process import entry_point
from attention_jax.lab.runs.study import run_study
from attention_jax.lab.runs.suite import run_suite
from attention_jax.lab.train import divergence


@dataclasses.dataclass(frozen=True)
class Finished:
  """A benchmark whose outputs are written.

  Attributes:
    summary: the path of its summary.md.
    figures: the paths of the figures it drew.
    diverged: None, or the line naming the runs (or settings) whose training
      diverged, for stderr; the entry point then exits `divergence.DIVERGED`.
  """
  summary: str
  figures: tuple[str, ...]
  diverged: Optional[str]


def run_benchmark(config: ml_collections.ConfigDict, workdir: str,
                  log: Callable[[str], None] = print) -> Optional[Finished]:
  """Runs this process's share of `config`'s benchmark (`BENCHMARKS`, by
  `config.protocol`) into `workdir`; `Finished` once its outputs are
  written, None when they wait for other shards (their jobs unfinished: the
  last shard to finish writes them)."""
  check_protocol_fields(config)  # before anything is written
  return BENCHMARKS[protocol_of(config)](config, workdir, log)


def _study(config, workdir, log) -> Optional[Finished]:
  written = run_study(config, workdir, log)
  if not written:
    return None
  # A study of two-operand tasks draws their grid too (TASK_grid.png).
  figures = [os.path.join(workdir, 'extrapolation.png')] + sorted(
      glob.glob(os.path.join(glob.escape(workdir), '*_grid.png')))
  return Finished(os.path.join(workdir, 'summary.md'), _existing(figures),
                  divergence.message(written))


def _suite(config, workdir, log) -> Optional[Finished]:
  records = run_suite(config, workdir, log)
  if records is None:
    return None
  return Finished(os.path.join(workdir, 'summary.md'),
                  _existing([os.path.join(workdir, suite_report.FIGURE)]),
                  suite_report.diverged_message(records))


# Each protocol's benchmark (its names: `presets.PROTOCOLS`); a new protocol
# is a row here and one in presets' tables, beside its own modules.
BENCHMARKS = {'decoder': _study, 'encoder': _suite}


def _existing(paths: list[str]) -> tuple[str, ...]:
  return tuple(p for p in paths if os.path.exists(p))


def show(finished: Optional[Finished]) -> int:
  """What an entry point prints of `finished` (nothing for a shard whose
  outputs wait for others): the summary, the figures' paths and, on stderr,
  the divergence line; returns the exit status (`divergence.DIVERGED` after
  a divergence, printed after every other run and the outputs, so nothing
  is lost by stopping)."""
  if finished is None:
    return 0
  with open(finished.summary) as f:
    print(f.read())
  if finished.figures:
    print('Figures: ' + ', '.join(finished.figures))
  if finished.diverged:
    print(finished.diverged, file=sys.stderr)
    return divergence.DIVERGED
  return 0


def run_command(config: ml_collections.ConfigDict, workdir: str) -> int:
  """A benchmark entry point's command after its flags: `run_benchmark` in
  the process set-up of `process.entry_point` (expected failures are one
  line and an exit status), then `show`; returns the exit status."""
  with entry_point(config, workdir):
    check_study_overrides()
    finished = run_benchmark(config, workdir)
  return show(finished)
