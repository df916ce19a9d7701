"""Process set-up shared by the experiment entry points.

Every entry point runs `app.run(main, flags_parser=parse_flags)` and wraps
its work in `entry_point(config)`: between them, a bad command line or
config is one line on stderr (`error: …`) and exit status 2, before any file
is written.
"""

import ast
import contextlib
import difflib
import glob
import importlib
import logging as std_logging
import os
import re
import sys
from typing import Optional, Sequence

import jax
import ml_collections
from absl import flags

from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.train.interrupt import stop_requests
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.workdir_checks import check_workdir
from attention_jax.lab.workdir_checks import folders
from attention_jax.lab.workdir_checks import remove_partial

GPU_DETERMINISM_FLAG = '--xla_gpu_deterministic_ops=true'


USAGE_ERROR = 2  # absl's (and the shell's) exit code for a bad command line
# "ValueError: text" lines in the text of an error raised by compiled code.
_RAISED = re.compile(r'^\s*(\w+(?:Error|Exception)): (.+)$', re.M)
# XLA's words for an allocation that failed (CPU: "Out of memory allocating N
# bytes", GPU: "RESOURCE_EXHAUSTED: Out of memory while trying to allocate …").
_OUT_OF_MEMORY = re.compile(r'RESOURCE_EXHAUSTED|out of memory', re.I)
_REDUCE = ('train.batch_size, eval.batch_size, the model (model.d_model, model.num_layers, '
           'model.mlp_dim) or the lengths (task.train_max_length, eval.max_length)')
# An override --config.PATH[=VALUE] (--noconfig.PATH: False), as ml_collections reads them.
_OVERRIDE = re.compile(r'^--?(?:no)?config\.([^=]+)(?:=(.*))?$', re.S)
_CONFIG_FLAG = re.compile(r'^--?config(?:=(.*))?$', re.S)
_ENCODING_OPTIONS = 'model.encoding_options'

# The command line ml_collections reads the `--config.PATH` overrides from
# (the `sys_argv` of presets.DEFINE_config_file): empty until `parse_flags`
# fills it, so that no override is read at import time, outside its checks.
CONFIG_ARGV: list[str] = []
_workdir: dict = {}  # the --workdir parse_flags checked: its path and the folders it held


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


def _quiet_logs() -> None:
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

  `workdir` defaults to the --workdir that `parse_flags` checked.
  """
  _quiet_logs()
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
      _usage_exit(f'config.imports has {module!r}: no such module on the path ({sys.path[0]!r} '
                  'first); name an importable module that registers your encoding, '
                  'e.g. --config.imports=my_module.')
  workdir = _workdir.get('path') if workdir is None else workdir
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
    _usage_exit(str(e))
  except (RuntimeError, MemoryError) as e:  # jax.errors.JaxRuntimeError
    message = out_of_memory(e)
    if message is not None:
      if workdir:
        remove_partial(os.path.abspath(workdir), before)
      _usage_exit(message)
    message = original_error(e) if isinstance(e, RuntimeError) else None
    if message is None:
      raise
    print(f'error: {message}', file=sys.stderr)
    sys.exit(1)


def _usage_exit(message: str) -> None:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(USAGE_ERROR)


def _field_names(section) -> str:
  return ', '.join(sorted(section.keys())) if isinstance(section, ml_collections.ConfigDict) else ''


def _check_path(config: ml_collections.ConfigDict, path: str) -> None:
  """Raises ConfigError unless --config.PATH names a field of `config`."""
  holder, walked = config, []
  for key in path.split('.'):
    if not isinstance(holder, ml_collections.ConfigDict) or key not in holder:
      where = '.'.join(walked) or 'the config'
      if not isinstance(holder, ml_collections.ConfigDict):
        raise ConfigError(f'--config.{path}: {where} is a value, not a group of fields.')
      close = difflib.get_close_matches(key, list(holder.keys()), n=1)
      hint = f"did you mean {'.'.join(walked + close)}? " if close else ''
      raise ConfigError(f'--config.{path}: {where} has no field {key!r}; {hint}'
                        f'its fields: {_field_names(holder)}.')
    holder, walked = holder[key], walked + [key]


def _literal(text: str):
  """A new option's value, typed as written: 64 -> int, (1, 2) -> tuple,
  true -> True, anything else the string itself."""
  if text.lower() in ('true', 'false'):
    return text.lower() == 'true'
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def _split_overrides(argv: list, config: ml_collections.ConfigDict):
  """Checks every --config.PATH of `argv` against `config`, and takes out the
  encoding options the config does not list (--config.model.encoding_options
  .NAME.OPTION=VALUE for an encoding without a group there, or an option its
  group lacks): ml_collections can only override fields that exist.

  Returns:
    (argv without those, [(NAME, OPTION, VALUE), …]).
  """
  kept, options, i = [argv[0]], [], 1
  while i < len(argv):
    arg, i = argv[i], i + 1
    if arg == '--':
      kept += argv[i - 1:]
      break
    match = _OVERRIDE.match(arg)
    if not match:
      kept.append(arg)
      continue
    path, value = match.groups()
    parts = path.split('.')
    known = config.model.get('encoding_options') if 'model' in config else None
    if (path.startswith(_ENCODING_OPTIONS + '.') and len(parts) == 4
        and isinstance(known, ml_collections.ConfigDict)
        and (parts[2] not in known or parts[3] not in (known[parts[2]] or {}))):
      if value is None:
        if i == len(argv) or argv[i].startswith('-'):
          raise ConfigError(f'--config.{path} needs a value: --config.{path}=VALUE.')
        value, i = argv[i], i + 1
      options.append((parts[2], parts[3], _literal(value)))
      continue
    if (path.startswith(_ENCODING_OPTIONS + '.') and len(parts) == 3
        and isinstance(known, ml_collections.ConfigDict) and parts[2] not in known):
      raise ConfigError(f'--config.{path}: {parts[2]!r} has no options in the config yet; set '
                        f'them one at a time, --config.{path}.OPTION=VALUE.')
    _check_path(config, path)
    kept.append(arg)
  return kept, options


def _add_options(config: ml_collections.ConfigDict, options: Sequence) -> None:
  """Adds encoding options the config did not list, keeping every other
  encoding's (validate_config checks each against its encoding's `build`,
  after config.imports has registered the encodings it names)."""
  with config.unlocked():
    groups = config.model.encoding_options
    for name, option, value in options:
      if name not in groups or groups[name] is None:
        groups[name] = ml_collections.ConfigDict()
      groups[name][option] = value


def _flag_error(error: flags.Error, config: Optional[ml_collections.ConfigDict]) -> str:
  """absl's 'flag --config.X=V: invalid literal …' as the field and its type."""
  text = str(error)
  match = re.match(r'flag --config\.([^=]+)=(.*?): (.*)$', text, re.S)
  if match and config is not None:
    path, value, why = match.groups()
    holder = config
    for key in path.split('.')[:-1]:
      holder = holder[key]
    kind = holder.get_type(path.split('.')[-1])
    raised = _RAISED.findall(why)
    why = raised[-1][1] if raised else why.strip().splitlines()[-1]
    return (f'--config.{path}={value}: {path} takes {getattr(kind, "__name__", kind)} '
            f'values ({why}).')
  raised = _RAISED.findall(text)  # a get_config's error: its last line, not the traceback
  flag = text.split(': ', 1)[0].removeprefix('flag ')
  return f'{flag}: {raised[-1][1]}' if raised else ' '.join(text.split())


def check_study_overrides(argv: Optional[Sequence[str]] = None) -> None:
  """Refuses `--config.model.encoding=…` on a study's command line (`argv`,
  default the one parse_flags checked): a study trains `study.encodings`,
  and `model.encoding` is the single run's (experiments.train), so the
  override would change nothing and the whole default sweep would start.

  Raises:
    ConfigError: naming the flag and the two ways to study that encoding.
  """
  for arg in (CONFIG_ARGV if argv is None else argv)[1:]:
    match = _OVERRIDE.match(arg)
    if match and match.group(1) == 'model.encoding':
      spec = match.group(2) or 'NAME'
      raise ConfigError(
          f'--config.model.encoding={spec} names the encoding of one run '
          '(experiments.train); a study trains study.encodings: '
          f'--config.study.encodings="(\'{spec}\',)", or the preset '
          f'--config=copy:encoding={spec}.')


def parse_flags(argv: Sequence[str], flag_values: flags.FlagValues = flags.FLAGS) -> list:
  """`app.run`'s flags_parser for the entry points: absl's parse, with every
  bad command line one line on stderr and exit 2 (absl: a traceback for an
  unknown --config field, a two-line FATAL and exit 1 for a bad value):

  * `--config` (a preset name or a get_config file): its get_config's error;
  * `--config.PATH=VALUE`: PATH must be a field (the message names its
    group's fields, and the closest one); VALUE must parse as its type;
  * `--config.model.encoding_options.NAME.OPTION=VALUE`: also for an
    encoding (or option) the config does not list, e.g. one a module of
    --config.imports registers; the others keep their defaults;
  * `--workdir`: not a file, writable (`check_workdir`).

  Args:
    argv: the command line, program name first.
    flag_values: where the flags are defined.

  Returns:
    The arguments left after the flags (program name first), as absl's.
  """
  _quiet_logs()
  argv = list(argv)
  config = None
  try:
    if 'config' in flag_values and any(_OVERRIDE.match(a) for a in argv[1:]):
      # The file first (ml_collections refuses an override before it), the
      # default one where none is named: overrides are read when it is.
      at = next((i for i, a in enumerate(argv) if _CONFIG_FLAG.match(a)), None)
      if at is None:
        flag = flag_values['config']
        spec = flag.default if isinstance(flag.default, str) else flag.default_unparsed
      else:
        spec = _CONFIG_FLAG.match(argv.pop(at)).group(1)
        spec = argv.pop(at) if spec is None and at < len(argv) else spec
      argv.insert(1, f'--config={spec}')
      try:
        config = flag_values['config'].parser.parse(spec)
      except (ValueError, TypeError) as e:
        raised = _RAISED.findall(str(e))
        raise ConfigError(f'--config={spec}: ' + (raised[-1][1] if raised else str(e))) from None
      argv, options = _split_overrides(argv, config)
    else:
      options = []
    CONFIG_ARGV[:] = argv
    rest = flag_values(argv)
    if options:
      _add_options(flag_values['config'].value, options)
    if 'workdir' in flag_values and isinstance(flag_values['workdir'].value, str):
      path = flag_values['workdir'].value
      check_workdir(path)
      _workdir.update(path=path)
  except ConfigError as e:
    _usage_exit(str(e))
  except flags.Error as e:
    _usage_exit(_flag_error(e, config))
  return rest
