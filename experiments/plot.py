r"""Redraw figures from finished (or partly finished) workdirs, after the fact.

  python -m experiments.plot --workdir=runs/study [--workdir=runs/one ...] \
      [--out=DIR]

Reads only files, from workdirs of either kind in any order: a study's
(results.csv, or for an interrupted sweep its runs/*/*/seed*/results.csv, and
the runs' metrics.jsonl) and experiments.train's (config.json, metrics.jsonl,
results.csv once evaluated). Writes extrapolation.png and training_curves.png
into --out (default: the single workdir, or the current folder for several);
with several workdirs, lines are labelled `workdir:encoding`; one study's
figure keeps its k-gram ceilings (ceiling.csv). With exactly
two, also comparison.md: per (task, encoding, length bucket) each one's
accuracy and the second minus the first, printed too. A folder that is
neither kind: one line on stderr, exit 2, nothing written.
"""

import sys

from absl import app
from absl import flags

from attention_jax.lab.runs import workdirs
from attention_jax.lab.runs.process import USAGE_ERROR
from attention_jax.lab.config.command_line import parse_flags
from attention_jax.lab.errors import ConfigError

_WORKDIRS = flags.DEFINE_multi_string('workdir', None, 'Workdir(s) to read.', required=True)
_OUT = flags.DEFINE_string('out', None, 'Where to write the figures.')

_rows = workdirs.study_rows  # the rows of one study workdir (tests use it)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    written = workdirs.redraw(_WORKDIRS.value, _OUT.value, log=print)
  except ConfigError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(USAGE_ERROR)
  print('wrote ' + ', '.join(written))


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
