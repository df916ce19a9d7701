r"""Attention heat maps and entropy: why an encoding fails to extrapolate.

  python -m experiments.attention_maps --workdir=runs/study

Run it on a study's workdir (`make experiment`) or on one experiments.train
run's: the config is the workdir's own (pass --config only to check the runs
against another one), and the first seed's model of each encoding is
restored from its final checkpoint (never trained: a missing or unfinished
run is an error naming it). Writes into --workdir attention_maps_ENCODING.png
(every layer and head, one copy example at L_train and at 4 × L_train) and
attention_entropy.png (entropy vs query position at 4 × L_train, one line per
encoding), and failures.md / failures.csv: for every seed at L_train, 2×, 4×
and 8× L_train, how the evaluation strings fail (an ambiguity, i.e. a
repeated k-gram; an early or a missed EOS; drift), beside their 3- and 4-gram
ceilings. About a minute or two on 2 CPU cores once the study has run.
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from attention_jax.lab.config import presets
from attention_jax.lab.runs.diagnose import figure_paths
from attention_jax.lab.runs.diagnose import run_diagnostics
from attention_jax.lab.runs.process import entry_point
from attention_jax.lab.config.command_line import parse_flags

_CONFIG = presets.DEFINE_config_file(
    'config', 'copy', 'Study configuration.')
_WORKDIR = flags.DEFINE_string('workdir', 'runs/study', 'The study workdir to read and draw into.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  flag = flags.FLAGS['config']
  given = flag.present or config_flags.get_override_values(flag)
  with entry_point(_CONFIG.value, _WORKDIR.value):
    curves = run_diagnostics(_CONFIG.value if given else None, _WORKDIR.value)
  print('Figures: ' + ', '.join(figure_paths(_WORKDIR.value, curves)))


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
