"""Console scripts (pyproject.toml's [project.scripts]): each runs one entry
point's `main` under absl, as `python -m experiments.NAME` does in the clone.

Installed, this package is `attention_jax.experiments` (the wheel maps
experiments/ there), so the scripts run from any folder:

  attention-jax-study --config=copy:scale=tiny --workdir=runs/tiny
"""

import importlib

from absl import app


def _run(module: str) -> None:
  # Imported on call: each module defines its own absl flags.
  main = importlib.import_module(f'{__package__}.{module}').main
  from attention_jax.lab.config.command_line import parse_flags  # pylint: disable=import-outside-toplevel
  app.run(main, flags_parser=parse_flags)


def study() -> None:
  """attention-jax-study: the length-extrapolation study (length_extrapolation.py)."""
  _run('length_extrapolation')


def train() -> None:
  """attention-jax-train: one model, evaluated at every length (train.py)."""
  _run('train')


def plot() -> None:
  """attention-jax-plot: figures redrawn from workdirs (plot.py)."""
  _run('plot')


def attention_maps() -> None:
  """attention-jax-attention-maps: heat maps and entropy of a study's models."""
  _run('attention_maps')


def seq2seq() -> None:
  """attention-jax-seq2seq: the seq2seq-bottleneck comparison (seq2seq_bottleneck.py)."""
  _run('seq2seq_bottleneck')


def chomsky() -> None:
  """attention-jax-chomsky: DeepMind's 15 tasks under their encoder protocol (chomsky.py)."""
  _run('chomsky')


def lesson_demo() -> None:
  """attention-jax-lesson-demo: lesson 7's worked example and shapes."""
  _run('lesson_demo')
