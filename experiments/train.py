r"""Train one model and evaluate it at every length.

  python -m experiments.train --config=configs/copy.py:encoding=rope --workdir=runs/one

Writes config.json, metrics.jsonl (every step), results.csv (accuracy per
length) and run.json (timings) into --workdir. The same command resumes (on
a finished run it prints where its evaluation is; --reevaluate evaluates it
again); a --workdir trained with another config is refused (or, with
--config.study.on_mismatch=retrain, the run goes to --workdir-2). Presets and
fields: configs/copy.py.
"""

import sys

from absl import app
from absl import flags

from attention_jax.lab.config import presets
from attention_jax.lab.train import divergence
from attention_jax.lab.report import results
from attention_jax.lab.runs.process import entry_point
from attention_jax.lab.config.command_line import parse_flags
from attention_jax.lab.runs.one_run import run_one

_CONFIG = presets.DEFINE_config_file(
    'config', 'copy', 'Run configuration.')
_WORKDIR = flags.DEFINE_string('workdir', 'runs/one', 'Where outputs are written.')
_REEVALUATE = flags.DEFINE_bool(
    'reevaluate', False, 'Evaluate a finished run again (else its results.csv is read back).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  with entry_point(_CONFIG.value, _WORKDIR.value):
    rows = run_one(_CONFIG.value, _WORKDIR.value, log=print, reevaluate=_REEVALUATE.value)
  print(results.run_table(rows))
  diverged = divergence.message(rows)
  if diverged:  # after the results: the run's files are complete, marked diverged
    print(diverged, file=sys.stderr)
    sys.exit(divergence.DIVERGED)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
