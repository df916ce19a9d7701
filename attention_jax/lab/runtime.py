"""Process set-up shared by the experiment entry points."""

import contextlib
import importlib
import logging as std_logging
import os
import re
import sys
from typing import Optional

import jax
import ml_collections
from absl import logging

from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.train.interrupt import stop_requests
from attention_jax.lab.validate import ConfigError

GPU_DETERMINISM_FLAG = '--xla_gpu_deterministic_ops=true'


USAGE_ERROR = 2  # absl's (and the shell's) exit code for a bad command line
# "ValueError: text" lines in the text of an error raised by compiled code.
_RAISED = re.compile(r'^(\w+(?:Error|Exception)): (.+)$', re.M)


class _QuietLibraries(std_logging.Filter):
  """Drops orbax's per-save INFO lines (a dozen per checkpoint); keeps warnings."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return record.levelno >= std_logging.WARNING or 'orbax' not in record.pathname


class _CallbackTraceback(std_logging.Filter):
  """Drops JAX's log of a failed host callback (a traceback printed before
  the error even reaches us); `original_error` prints its message instead,
  and an error it cannot read keeps the traceback in its own text."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return 'callback failed' not in record.getMessage()


def original_error(error: Exception) -> Optional[str]:
  """The message of the exception a host callback raised inside compiled
  code (a range check: a learned table read past its rows, a KV cache
  written past its end), which XLA buries in its own error text
  ("INTERNAL: CpuCallback error … ValueError: …"); None for other errors."""
  text = str(error)
  if 'callback' not in text.lower():
    return None
  raised = _RAISED.findall(text)
  return f'{raised[-1][0]}: {raised[-1][1]}' if raised else None


@contextlib.contextmanager
def entry_point(config: ml_collections.ConfigDict):
  """Sets up JAX from `config` before anything touches a device, holds one
  stop-request scope over the whole job (`train.interrupt`), and turns the
  expected failures into one line on stderr and an exit code:

  * `TrainingInterrupted`: its message, exit 128 + signal (0 for
    `train.stop_after`);
  * `ConfigError` (a bad config, a workdir trained with another config):
    `error: MESSAGE`, exit 2, raised before any file is written;
  * an error raised by a host callback in compiled code: `error: ` and the
    original exception's line, exit 1.

  Anything else keeps its traceback.

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
  std_logging.getLogger('jax._src.debugging').addFilter(_CallbackTraceback())
  if config.deterministic_gpu and GPU_DETERMINISM_FLAG not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' + GPU_DETERMINISM_FLAG).strip()
  if config.distributed:
    jax.distributed.initialize()
  for module in config.get('imports', ()):
    importlib.import_module(module)
  try:
    with stop_requests():
      yield
  except TrainingInterrupted as e:
    logging.warning('%s', e.args[0])
    print(e.args[0], file=sys.stderr)
    sys.exit(e.exit_code)
  except ValueError as e:
    # ConfigError, and the 'invalid config: …' errors of checks made where
    # the value is used (the tasks' options).
    if not isinstance(e, ConfigError) and not str(e).startswith('invalid config:'):
      raise
    print(f'error: {e}', file=sys.stderr)
    sys.exit(USAGE_ERROR)
  except RuntimeError as e:  # jax.errors.JaxRuntimeError, XlaRuntimeError in older JAX
    message = original_error(e)
    if message is None:
      raise
    print(f'error: {message}', file=sys.stderr)
    sys.exit(1)
