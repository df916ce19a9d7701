r"""Lesson 7.1's claim as a measurement: seq2seq without attention vs with
Bahdanau attention vs the transformer, accuracy vs length on the copy tasks.

  python -m experiments.seq2seq_bottleneck --config=configs/seq2seq.py \
      --workdir=runs/seq2seq

Writes results.csv, summary.md, extrapolation.png and attention_heatmap.png
(Bahdanau weights for one example at L_train and at 4 × L_train, from the
first seed's attention model) into --workdir. See configs/seq2seq.py.
"""

import os

from absl import app
from absl import flags

from attention_jax.lab import evaluate
from attention_jax.lab.config import presets
from attention_jax.lab import tasks
from attention_jax.lab.report.plots import plot_alignments
from attention_jax.lab.runs.process import entry_point
from attention_jax.lab.config.command_line import parse_flags
from attention_jax.lab.runs.study import run_study

_CONFIG = presets.DEFINE_config_file(
    'config', 'seq2seq', 'Study configuration.')
_WORKDIR = flags.DEFINE_string('workdir', 'runs/seq2seq', 'Where outputs are written.')


def draw_heatmap(model, config, run_dir):
  """After training the first seed's attention model: its alignments."""
  if config.model.kind != 'seq2seq_attention' or config.train.seed != config.study.seeds[0]:
    return
  train_max = config.task.train_max_length
  panels = []
  for length in (train_max, min(4 * train_max, config.eval.max_length)):
    alignment = evaluate.seq2seq_alignment(
        model, tasks.get_task(config.task.name), length,
        vocab_size=config.task.vocab_size, seed=config.eval.seed)
    panels.append((f'{config.task.name}, input length {length}', alignment))
  plot_alignments(panels, os.path.join(_WORKDIR.value, 'attention_heatmap.png'))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  with entry_point(_CONFIG.value, _WORKDIR.value):  # validates, then creates the workdir
    run_study(_CONFIG.value, _WORKDIR.value, on_trained=draw_heatmap)
  print(open(os.path.join(_WORKDIR.value, 'summary.md')).read())
  # Each figure by its whole path (the heat map only where an attention model ran).
  figures = [os.path.join(_WORKDIR.value, name)
             for name in ('extrapolation.png', 'attention_heatmap.png')]
  print('Figures: ' + ', '.join(p for p in figures if os.path.exists(p)))


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
