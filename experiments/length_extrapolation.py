r"""The length-extrapolation study: tasks × encodings × seeds, train short,
evaluate long.

  python -m experiments.length_extrapolation --config=configs/copy.py \
      --workdir=runs/study [--config.study.seeds="(0,1)"] [...]

Writes results.csv, summary.md and extrapolation.png into --workdir, and each
run into --workdir/TASK/LABEL/seedN/. Re-running the same command skips finished runs.
See configs/copy.py for presets, expected results and runtime.

The config's `protocol` chooses the benchmark (`lab.runs.benchmarks`): an
encoder config (`--config=chomsky`) runs DeepMind's suite here as
experiments.chomsky does.
"""

import sys

from absl import app
from absl import flags

from attention_jax.lab.config import presets
from attention_jax.lab.config.command_line import parse_flags
from attention_jax.lab.runs import benchmarks

_CONFIG = presets.DEFINE_config_file(
    'config', 'copy', 'Study configuration.', protocols=presets.PROTOCOLS)
_WORKDIR = flags.DEFINE_string('workdir', 'runs/study', 'Where outputs are written.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  sys.exit(benchmarks.run_command(_CONFIG.value, _WORKDIR.value))


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
