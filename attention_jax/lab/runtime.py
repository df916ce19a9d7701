"""Process set-up shared by the experiment entry points."""

import contextlib
import importlib
import logging as std_logging
import os
import sys

import jax
import ml_collections
from absl import logging

from attention_jax.lab.train.interrupt import TrainingInterrupted

GPU_DETERMINISM_FLAG = '--xla_gpu_deterministic_ops=true'


class _QuietLibraries(std_logging.Filter):
  """Drops orbax's per-save INFO lines (a dozen per checkpoint); keeps warnings."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return record.levelno >= std_logging.WARNING or 'orbax' not in record.pathname


@contextlib.contextmanager
def entry_point(config: ml_collections.ConfigDict):
  """Sets up JAX from `config` before anything touches a device, and turns a
  `TrainingInterrupted` into a one-line message and exit code 128 + signal
  (0 for `train.stop_after`).

  * `config.deterministic_gpu`: adds `--xla_gpu_deterministic_ops=true` to
    XLA_FLAGS (bitwise-reproducible GPU runs, somewhat slower). CPU runs are
    deterministic without it.
  * `config.distributed`: `jax.distributed.initialize()` for multi-host runs
    (coordinator and process ids from the environment, as on Cloud TPU/SLURM).
  * `config.imports`: modules imported first, e.g. one that registers its own
    encoding with `attention_jax.register_encoding`, so that the config can
    name it.
  """
  std_logging.getLogger('absl').addFilter(_QuietLibraries())
  if config.deterministic_gpu and GPU_DETERMINISM_FLAG not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' + GPU_DETERMINISM_FLAG).strip()
  if config.distributed:
    jax.distributed.initialize()
  for module in config.get('imports', ()):
    importlib.import_module(module)
  try:
    yield
  except TrainingInterrupted as e:
    logging.warning('%s', e.args[0])
    print(e.args[0], file=sys.stderr)
    sys.exit(e.exit_code)
