"""The command line of the experiment entry points, parsed so that every
bad one is one line on stderr and exit status 2 (absl: a traceback for an
unknown --config field, a two-line FATAL and exit 1 for a bad value).

`parse_flags` is `app.run`'s flags_parser. The `--config.PATH` overrides it
checked are the only ones ml_collections reads: the config flag reads them
from a list of its own (`presets.DEFINE_config_file`), which `parse_flags`
fills, so that no override is read at import time, outside these checks.
"""

import ast
import difflib
import re
from typing import Optional, Sequence

import ml_collections
from absl import flags

from attention_jax.lab.config.renamed import RENAMED
from attention_jax.lab.config.presets import protocol_presets
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.runs.process import quiet_logs
from attention_jax.lab.runs.process import usage_exit
from attention_jax.lab.runs.workdir_checks import check_workdir

# An override --config.PATH[=VALUE] (--noconfig.PATH: False), as ml_collections reads them.
_OVERRIDE = re.compile(r'^--?(?:no)?config\.([^=]+)(?:=(.*))?$', re.S)
_CONFIG_FLAG = re.compile(r'^--?config(?:=(.*))?$', re.S)
_ENCODING_OPTIONS = 'model.encoding_options'
# "ValueError: text" lines in an error's text (a get_config's traceback).
_RAISED = re.compile(r'^\s*(\w+(?:Error|Exception)): (.+)$', re.M)


def checked_argv(flag_values: flags.FlagValues = flags.FLAGS) -> list:
  """The command line `parse_flags` checked (the config flag's own list;
  empty before parsing or without a config flag)."""
  if 'config' not in flag_values:
    return []
  return getattr(flag_values['config'], 'checked_argv', [])


def _field_names(section) -> str:
  return ', '.join(sorted(section.keys())) if isinstance(section, ml_collections.ConfigDict) else ''


def _has(config: ml_collections.ConfigDict, path: tuple) -> bool:
  holder = config
  for key in path:
    if not isinstance(holder, ml_collections.ConfigDict) or key not in holder:
      return False
    holder = holder[key]
  return True


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
      renamed = RENAMED.get(tuple(path.split('.')))
      if renamed and _has(config, renamed):
        hint = f"it is {'.'.join(renamed)} now, the study's name for it; "
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
    if path == 'protocol':
      # The protocol decides which fields a config has (its preset's); the
      # other protocol's benchmark would not find them.
      given = f'--config.protocol={value}' if value is not None else '--config.protocol'
      raise ConfigError(f'{given}: the protocol is the config file\'s own (its fields are '
                        f'that protocol\'s), not an override; run a config of the protocol '
                        f'instead: {protocol_presets()}.')
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
  default the one parse_flags checked, `checked_argv()`): a study trains `study.encodings`,
  and `model.encoding` is the single run's (experiments.train), so the
  override would change nothing and the whole default sweep would start.

  Raises:
    ConfigError: naming the flag and the two ways to study that encoding.
  """
  for arg in (checked_argv() if argv is None else argv)[1:]:
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
  quiet_logs()
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
    if 'config' in flag_values and hasattr(flag_values['config'], 'checked_argv'):
      flag_values['config'].checked_argv[:] = argv
    rest = flag_values(argv)
    if options:
      _add_options(flag_values['config'].value, options)
    if 'workdir' in flag_values and isinstance(flag_values['workdir'].value, str):
      path = flag_values['workdir'].value
      check_workdir(path)
  except ConfigError as e:
    usage_exit(str(e))
  except flags.Error as e:
    usage_exit(_flag_error(e, config))
  return rest
