r"""The length-extrapolation study: tasks × encodings × seeds, train short,
evaluate long.

  python -m experiments.length_extrapolation --config=configs/copy.py \
      --workdir=runs/copy [--config.study.seeds="(0,1)"] [...]

Writes results.csv, summary.md and extrapolation.png into --workdir, and each
run into --workdir/runs/. Re-running the same command skips finished runs.
See configs/copy.py for presets, expected results and runtime.
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from attention_jax.lab.runtime import entry_point
from attention_jax.lab.study import run_study

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/copy.py', 'Study configuration (a get_config file).')
_WORKDIR = flags.DEFINE_string('workdir', 'runs/copy', 'Where outputs are written.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  with entry_point(_CONFIG.value):
    run_study(_CONFIG.value, _WORKDIR.value)
  print(open(f'{_WORKDIR.value}/summary.md').read())
  print(f'Figure: {_WORKDIR.value}/extrapolation.png')


if __name__ == '__main__':
  app.run(main)
