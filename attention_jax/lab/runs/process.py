"""The process around an experiment: log filters, XLA flags, multi-host
set-up, the modules a config imports, and the exit status of every expected
failure.

Every entry point runs `app.run(main, flags_parser=command_line.parse_flags)`
and wraps its work in `entry_point(config, workdir)`: between them, a bad
command line or config is one line on stderr (`error: …`) and exit status 2,
before any file is written.
"""

import contextlib
import glob
import importlib
import logging as std_logging
import os
import re
import sys
from typing import Optional

import jax
import ml_collections

from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.train.interrupt import stop_requests
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.runs.workdir_checks import folders
from attention_jax.lab.runs.workdir_checks import remove_partial

GPU_DETERMINISM_FLAG = '--xla_gpu_deterministic_ops=true'


USAGE_ERROR = 2  # absl's (and the shell's) exit code for a bad command line
# "ValueError: text" lines in the text of an error raised by compiled code.
_RAISED = re.compile(r'^\s*(\w+(?:Error|Exception)): (.+)$', re.M)
# XLA's words for an allocation that failed (CPU: "Out of memory allocating N
# bytes", GPU: "RESOURCE_EXHAUSTED: Out of memory while trying to allocate …").
_OUT_OF_MEMORY = re.compile(r'RESOURCE_EXHAUSTED|out of memory', re.I)
_REDUCE = ('train.batch_size, eval.batch_size, the model (model.d_model, model.num_layers, '
           'model.mlp_dim) or the lengths (task.train_max_length, eval.max_length)')


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


class _NoTpuProbe(std_logging.Filter):
  """Drops JAX's "Unable to initialize backend 'tpu'" line (libtpu.so not
  found), logged at every start on a machine without TPU chips, where it
  reads like a failure; kept where TPU chips are present."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Unable to initialize backend 'tpu'")


def quiet_logs() -> None:
  """Installs the filters above, once, before JAX initialises a backend."""
  for name, kind in (('absl', _QuietLibraries), ('jax._src.debugging', _CallbackTraceback),
                     ('jax._src.xla_bridge', _NoTpuProbe)):
    logger = std_logging.getLogger(name)
    if kind is _NoTpuProbe and (glob.glob('/dev/accel*') or glob.glob('/dev/vfio/[0-9]*')):
      continue  # TPU chips (v2–v4: /dev/accel*, v5e on: /dev/vfio/N): the line is news
    if not any(isinstance(f, kind) for f in logger.filters):
      logger.addFilter(kind())


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


def out_of_memory(error: BaseException) -> Optional[str]:
  """The one-line message for an allocation that failed (XLA's
  RESOURCE_EXHAUSTED, or numpy's MemoryError), naming what to reduce; None
  for other errors."""
  if isinstance(error, MemoryError):
    what = 'out of host memory'
  elif isinstance(error, RuntimeError) and _OUT_OF_MEMORY.search(str(error)):
    found = re.search(r'out of memory[^\n]*?(?=\.?$)', str(error), re.I | re.M)
    what = found.group(0) if found else 'out of memory'
  else:
    return None
  return f'{what}; reduce {_REDUCE}.'


@contextlib.contextmanager
def entry_point(config: ml_collections.ConfigDict, workdir: Optional[str] = None):
  """Sets up JAX from `config` before anything touches a device, holds one
  stop-request scope over the whole job (`train.interrupt`), and turns the
  expected failures into one line on stderr and an exit code:

  * `TrainingInterrupted`: its message, exit 128 + signal (0 for
    `train.stop_after`, 75 for `train.max_minutes`: `interrupt.TIME_BUDGET`);
  * `ConfigError` (a bad config, a workdir trained with another config), a
    module of `config.imports` that does not exist: `error: MESSAGE`, exit
    2, raised before any file is written;
  * out of memory (XLA's RESOURCE_EXHAUSTED): `error: …; reduce …` naming
    the fields to reduce, exit 2; the folders this invocation made under
    `workdir` that hold no finished checkpoint are removed first;
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

  `workdir`: the --workdir of the command (`command_line.parse_flags`
  checked it), or None for none.
  """
  quiet_logs()
  if config.deterministic_gpu and GPU_DETERMINISM_FLAG not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' + GPU_DETERMINISM_FLAG).strip()
  if config.distributed:
    jax.distributed.initialize()
  for module in config.get('imports', ()):
    try:
      importlib.import_module(module)
    except ModuleNotFoundError as e:
      if e.name is None or not (module + '.').startswith(e.name + '.'):
        raise  # the module exists; something it imports does not: its traceback says what
      usage_exit(f'config.imports has {module!r}: no such module on the path ({sys.path[0]!r} '
                  'first); name an importable module that registers your encoding, '
                  'e.g. --config.imports=my_module.')
  before = folders(os.path.abspath(workdir)) if workdir else set()
  try:
    with stop_requests():
      yield
  except TrainingInterrupted as e:
    print(e.args[0], file=sys.stderr)  # once: not logged as well
    sys.exit(e.exit_code)
  except ValueError as e:
    # ConfigError, and the 'invalid config: …' errors of checks made where
    # the value is used (the tasks' options).
    if not isinstance(e, ConfigError) and not str(e).startswith('invalid config:'):
      raise
    usage_exit(str(e))
  except (RuntimeError, MemoryError) as e:  # jax.errors.JaxRuntimeError
    message = out_of_memory(e)
    if message is not None:
      if workdir:
        remove_partial(os.path.abspath(workdir), before)
      usage_exit(message)
    message = original_error(e) if isinstance(e, RuntimeError) else None
    if message is None:
      raise
    print(f'error: {message}', file=sys.stderr)
    sys.exit(1)


def usage_exit(message: str) -> None:
  """`error: MESSAGE` on stderr and exit status 2."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(USAGE_ERROR)
