r"""DeepMind's length-generalization benchmark (15 tasks, the encoder
protocol of Delétang et al. 2023 and Ruoss et al. 2023) over encodings and
seeds; any task of `attention_jax.lab.tasks.SPECS` runs under it.

  python -m experiments.chomsky --config=configs/chomsky.py --workdir=runs/chomsky

Writes settings/…/*.json (one per task × encoding × learning rate),
results.csv, summary.md and chomsky.png into --workdir. Re-running the same
command skips finished settings and resumes a group in training from its
checkpoint; on a cluster, a job array shares the work (`study.shard`). See configs/chomsky.py for presets,
expected results and runtime.

The config's `protocol` chooses the benchmark (`lab.runs.benchmarks`): this
is experiments.length_extrapolation with the suite's default config and
workdir, and a decoder config (`--config=copy`) runs the study here.
"""

import sys

from absl import app
from absl import flags

from attention_jax.lab.config import presets
from attention_jax.lab.config.command_line import parse_flags
from attention_jax.lab.runs import benchmarks

_CONFIG = presets.DEFINE_config_file('config', 'chomsky', 'Suite configuration.',
                                     protocols=presets.PROTOCOLS)
_WORKDIR = flags.DEFINE_string('workdir', 'runs/chomsky', 'Where outputs are written.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  sys.exit(benchmarks.run_command(_CONFIG.value, _WORKDIR.value))


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
