r"""The length-extrapolation study: tasks × encodings × seeds, train short,
evaluate long.

  python -m experiments.length_extrapolation --config=configs/copy.py \
      --workdir=runs/study [--config.study.seeds="(0,1)"] [...]

Writes results.csv, summary.md and extrapolation.png into --workdir, and each
run into --workdir/TASK/LABEL/seedN/. Re-running the same command skips finished runs.
See configs/copy.py for presets, expected results and runtime.
"""

import glob
import os
import sys

from absl import app
from absl import flags

from attention_jax.lab.config import presets
from attention_jax.lab.train import divergence
from attention_jax.lab.config.command_line import check_study_overrides
from attention_jax.lab.runs.process import entry_point
from attention_jax.lab.config.command_line import parse_flags
from attention_jax.lab.runs.study import run_study

_CONFIG = presets.DEFINE_config_file(
    'config', 'copy', 'Study configuration.')
_WORKDIR = flags.DEFINE_string('workdir', 'runs/study', 'Where outputs are written.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  with entry_point(_CONFIG.value, _WORKDIR.value):
    check_study_overrides()
    written = run_study(_CONFIG.value, _WORKDIR.value)
  if not written:  # a shard whose sweep is unfinished: the last shard writes them
    return
  print(open(f'{_WORKDIR.value}/summary.md').read())
  # A study of two-operand tasks draws their grid too (TASK_grid.png).
  figures = [os.path.join(_WORKDIR.value, 'extrapolation.png')] + sorted(
      glob.glob(os.path.join(glob.escape(_WORKDIR.value), '*_grid.png')))
  print('Figures: ' + ', '.join(p for p in figures if os.path.exists(p)))
  diverged = divergence.message(written)
  if diverged:  # after every other run and the outputs: nothing is lost by stopping
    print(diverged, file=sys.stderr)
    sys.exit(divergence.DIVERGED)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
