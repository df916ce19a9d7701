"""Config presets by name or by path: the entry points' `--config` flag.

The presets (the clone's configs/*.py) ship inside the package as
`attention_jax.configs`, so an installed package finds them from any folder:
`--config=copy:scale=tiny`, `--config=copy.py:scale=tiny` and, where no such
file exists, `--config=configs/copy.py` all name the packaged
`configs/copy.py`; a path to an existing file is that file, as
ml_collections reads it. With no `--config`, the default preset is the
packaged one, never a path relative to the current folder.
"""

import functools
import importlib.util
import os
import sys

from absl import flags
from ml_collections import config_flags

from attention_jax.lab.runs.process import usage_exit
from attention_jax.lab.errors import ConfigError

_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # attention_jax/


def presets_dir() -> str:
  """The folder of the packaged presets: `attention_jax/configs` in an
  installed package; in a source tree (the clone, an editable install), its
  `configs/` beside `attention_jax/`. Never the current folder."""
  installed = os.path.join(_PACKAGE, 'configs')
  if os.path.isdir(installed):
    return installed
  tree = os.path.dirname(_PACKAGE)
  # Only in a source tree: a bare site-packages may hold someone else's `configs`.
  if os.path.isfile(os.path.join(tree, 'pyproject.toml')):
    return os.path.join(tree, 'configs')
  raise FileNotFoundError(f'{installed}: the packaged presets are missing; '
                          'reinstall attention_jax.')


def available() -> list[str]:
  """The packaged presets' names (files of presets_dir(), without `.py`)."""
  return sorted(n[:-3] for n in os.listdir(presets_dir())
                if n.endswith('.py') and not n.startswith('_'))


def resolve(spec: str) -> str:
  """`PATH[:ARG]` or `NAME[:ARG]` -> `FILE[:ARG]`, the form ml_collections reads.

  Args:
    spec: the `--config` value: a get_config file (used as given when it
      exists), or a preset: `NAME`, `NAME.py` or `configs/NAME.py`, where NAME
      is one of `available()`; then `:ARG` for the preset's get_config(ARG).

  Returns:
    `spec` with its path replaced by the packaged preset's file, or unchanged.

  Raises:
    ConfigError: the path is neither a file nor a packaged preset.
  """
  path, colon, arg = spec.partition(':')
  if os.path.isfile(path):
    return spec
  folder, name = os.path.split(path)
  name = name[:-3] if name.endswith('.py') else name
  names = available()
  if folder in ('', 'configs') and name in names:
    return os.path.join(presets_dir(), f'{name}.py') + colon + arg
  raise ConfigError(f'--config={path!r} is neither a file nor a packaged preset; '
                    f'presets: {", ".join(names)} (e.g. --config={names[0]}:scale=tiny), '
                    'or the path to a get_config file.')


# What each kind of config runs under (a config's `kind` field; the copy
# study's configs have none: 'study').
ENTRY_POINTS = {
    'study': 'experiments.length_extrapolation, train, seq2seq_bottleneck or attention_maps '
             '(attention-jax-study, attention-jax-train, …)',
    'chomsky': 'experiments.chomsky (attention-jax-chomsky)',
}


def kind_of(config) -> str:
  """Which entry points take `config`: its `kind` field, 'study' without one."""
  return config.get('kind', 'study') if hasattr(config, 'get') else 'study'


def _load(spec: str):
  """get_config(ARG) of the file or preset `spec` (`resolve`'s forms)."""
  path, _, arg = resolve(spec).partition(':')
  module_spec = importlib.util.spec_from_file_location('_preset', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


@functools.lru_cache(maxsize=None)
def presets_of(kind: str) -> tuple[str, ...]:
  """The packaged presets whose get_config() is of `kind` (each file run
  once per process: the packaged presets do not change while it runs)."""
  return tuple(name for name in available() if kind_of(_load(name)) == kind)


class _PresetParser(flags.ArgumentParser):
  """ml_collections' config-file parser, on the resolved preset; a config
  of another kind than the default's (another entry point's) is refused."""

  def __init__(self, parser: flags.ArgumentParser, kind: str):
    self._parser, self.kind = parser, kind

  def parse(self, argument):
    try:
      resolved = resolve(argument)
    except ConfigError as e:
      # Raised, absl would print it as a two-line "FATAL Flags parsing error"
      # and exit 1; a bad command line here is one line and exit 2.
      usage_exit(str(e))
    # ml_collections loads every file as the module `config_config`, re-running
    # it in the module of the file before (the default preset, loaded at
    # import): a file without get_config would inherit that one's and train it.
    sys.modules.pop(f'{getattr(self._parser, "name", "config")}_config', None)
    try:
      config = self._parser.parse(resolved)
    except SyntaxError as e:  # the file cannot be read as Python: where, not a traceback
      where = f'{e.filename or resolved.partition(":")[0]}, line {e.lineno}'
      usage_exit(f'--config={argument}: {where}: {e.msg} (a syntax error in the config '
                  'file).')
    except AttributeError as e:
      if "'get_config'" not in str(e):
        raise
      usage_exit(f'--config={argument}: {resolved.partition(":")[0]} defines no '
                  'get_config(); a config file defines get_config() (or get_config(arg) for '
                  '--config=FILE:arg) returning an ml_collections.ConfigDict.')
    if kind_of(config) != self.kind:
      usage_exit(f'--config={argument}: a {kind_of(config)!r} config, for '
                  f'{ENTRY_POINTS.get(kind_of(config), "another entry point")}; this entry '
                  f'point takes {self.kind!r} configs: the presets '
                  f'{", ".join(presets_of(self.kind))}, or a file of that kind.')
    return config

  def flag_type(self):
    return self._parser.flag_type()




def DEFINE_config_file(name: str, default: str, help_string: str,  # pylint: disable=invalid-name
                       flag_values: flags.FlagValues = flags.FLAGS) -> flags.FlagHolder:
  """ml_collections' DEFINE_config_file, taking preset names as well as paths.

  Args:
    name: the flag's name (`config`).
    default: the preset (or file) used without the flag, e.g. `'copy'`;
      resolved now, so that it never depends on the current folder.
    help_string: the flag's help.
    flag_values: where the flag is defined (absl's global FLAGS by default).

  Returns:
    The flag's holder; `.value` is the ConfigDict.
  """
  # Loaded for its kind: an entry point takes the configs of its default's kind.
  kind = kind_of(_load(default))
  mine = presets_of(kind)
  example = default if default in mine else mine[0]
  # Overrides are read from the command line command_line.parse_flags
  # checked (it fills this list), never at import time.
  checked = []
  holder = config_flags.DEFINE_config_file(
      name, resolve(default), f'{help_string} A packaged preset ({", ".join(mine)}; '
      f'e.g. --{name}={example}:scale=tiny) or the path to a get_config file.',
      flag_values=flag_values, sys_argv=checked)
  flag = flag_values[name]
  flag.parser = _PresetParser(flag.parser, kind)
  flag.checked_argv = checked
  # A key flag of the entry point's module, so that its --help lists it
  # (absl lists the main module's own and key flags; this one is defined in
  # ml_collections' module). absl names the main module by sys.argv[0].
  caller = sys._getframe(1).f_globals.get('__name__')  # pylint: disable=protected-access
  flag_values.register_key_flag_for_module(sys.argv[0] if caller == '__main__' else caller,
                                           flag)
  return holder
