r"""Attention heat maps and entropy: why an encoding fails to extrapolate.

  python -m experiments.attention_maps --config=configs/copy.py --workdir=runs/copy

Run it on the workdir of `make experiment` (configs/copy.py's study): the
first seed's model of each encoding is restored from there (and trained if
missing). Writes into --workdir attention_maps_ENCODING.png (every layer and
head, one copy example at L_train and at 4 × L_train) and attention_entropy.png
(entropy vs query position at 4 × L_train, one line per encoding). About a
minute on 2 CPU cores once the study has run.
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from attention_jax.lab.diagnose import run_diagnostics
from attention_jax.lab.runtime import entry_point

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/copy.py', 'Study configuration (a get_config file).')
_WORKDIR = flags.DEFINE_string('workdir', 'runs/copy', 'The study workdir to read and draw into.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  with entry_point(_CONFIG.value):
    run_diagnostics(_CONFIG.value, _WORKDIR.value)
  print(f'Figures: {_WORKDIR.value}/attention_maps_*.png, attention_entropy.png')


if __name__ == '__main__':
  app.run(main)
