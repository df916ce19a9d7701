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

from attention_jax.lab.config.entries import flatten
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


# Which entry points run each protocol's configs (a config's `protocol`
# field: how a model reads its tasks and is scored, lab/protocols/).
ENTRY_POINTS = {
    'decoder': 'experiments.length_extrapolation or experiments.chomsky, train, '
               'seq2seq_bottleneck or attention_maps (attention-jax-study, attention-jax-train, …)',
    'encoder': 'experiments.chomsky or experiments.length_extrapolation (attention-jax-chomsky, '
               'attention-jax-study)',
}
PROTOCOLS = tuple(ENTRY_POINTS)
# Each protocol's packaged preset: the fields a config of the protocol has.
FIELDS_OF = {'decoder': 'copy', 'encoder': 'chomsky'}


def protocol_of(config) -> str:
  """`config.protocol`: 'decoder' (a causal decoder, teacher-forced and
  generated: the copy study, addition, flip-flop) or 'encoder' (DeepMind's
  blank output slots: configs/chomsky.py); 'decoder' where a config has none.

  Raises:
    ConfigError: for any other value, or for the field's older name `kind`.
  """
  if not hasattr(config, 'get'):
    return 'decoder'
  if 'kind' in config:
    older = config.get('kind')
    raise ConfigError(f"invalid config: the field kind={older!r} is named protocol now: "
                      f"protocol={'encoder' if older == 'chomsky' else 'decoder'!r} "
                      f'(one of {PROTOCOLS}).')
  protocol = config.get('protocol', 'decoder')
  if protocol not in PROTOCOLS:
    raise ConfigError(f'invalid config: protocol={protocol!r}; choose from {PROTOCOLS}.')
  return protocol


def _load(spec: str):
  """get_config(ARG) of the file or preset `spec` (`resolve`'s forms)."""
  path, _, arg = resolve(spec).partition(':')
  module_spec = importlib.util.spec_from_file_location('_preset', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def protocol_presets() -> str:
  """The packaged presets of each protocol, in words."""
  return '; '.join(f'{p}: {", ".join(presets_of((p,)))}' for p in PROTOCOLS)


def check_protocol_fields(config) -> None:
  """Refuses a config whose fields are the other protocol's: one made from
  the other protocol's preset that names this protocol, say, which the
  benchmark would fail inside. A config has more of its protocol's own
  fields (`_own_fields`) than of the other's (a config of a preset derived
  from its protocol's may drop or add a few).

  Raises:
    ConfigError: naming the protocol, the other's fields the config has and
      the preset whose fields a config of the protocol has.
  """
  protocol = protocol_of(config)
  other, = (p for p in PROTOCOLS if p != protocol)
  own = _own_fields()
  have = set(flatten(config.to_dict()))
  if len(have & own[other]) > len(have & own[protocol]):
    theirs = sorted(have & own[other])
    named = f'protocol={protocol!r}' if 'protocol' in config else (
        f'no protocol field (so {protocol!r})')
    raise ConfigError(f'invalid config: {named}, but its fields are the {other} '
                      f'protocol\'s ({len(theirs)} of configs/{FIELDS_OF[other]}.py\'s own: '
                      f'{", ".join(theirs[:3])}, …); a config of protocol {protocol!r} has '
                      f'the fields of configs/{FIELDS_OF[protocol]}.py.')


@functools.lru_cache(maxsize=None)
def _own_fields() -> dict[str, frozenset]:
  """Each protocol's own fields: those of its preset (`FIELDS_OF`) that no
  other protocol's preset has (each preset run once per process, as in
  `presets_of`)."""
  fields = {p: set(flatten(_load(FIELDS_OF[p]).to_dict())) for p in PROTOCOLS}
  return {p: frozenset(fields[p].difference(*(fields[q] for q in PROTOCOLS if q != p)))
          for p in PROTOCOLS}


@functools.lru_cache(maxsize=None)
def presets_of(protocols: tuple[str, ...]) -> tuple[str, ...]:
  """The packaged presets whose get_config() is of one of `protocols` (each
  file run once per process: the packaged presets do not change while it runs)."""
  return tuple(name for name in available() if protocol_of(_load(name)) in protocols)


class _PresetParser(flags.ArgumentParser):
  """ml_collections' config-file parser, on the resolved preset; a config
  of a protocol the entry point does not run (another entry point's) is refused."""

  def __init__(self, parser: flags.ArgumentParser, protocols: tuple[str, ...]):
    self._parser, self.protocols = parser, protocols

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
    try:
      protocol = protocol_of(config)
      check_protocol_fields(config)  # before which entry point runs it: the fields decide
    except ConfigError as e:
      usage_exit(f'--config={argument}: {e}')
    if protocol not in self.protocols:
      usage_exit(f'--config={argument}: a config of protocol {protocol!r}, for '
                  f'{ENTRY_POINTS[protocol]}; this entry point takes protocol '
                  f'{" or ".join(map(repr, self.protocols))}: the presets '
                  f'{", ".join(presets_of(self.protocols))}, or a file of that protocol.')
    return config

  def flag_type(self):
    return self._parser.flag_type()


def DEFINE_config_file(name: str, default: str, help_string: str,  # pylint: disable=invalid-name
                       flag_values: flags.FlagValues = flags.FLAGS,
                       protocols: tuple[str, ...] = ()) -> flags.FlagHolder:
  """ml_collections' DEFINE_config_file, taking preset names as well as paths.

  Args:
    name: the flag's name (`config`).
    default: the preset (or file) used without the flag, e.g. `'copy'`;
      resolved now, so that it never depends on the current folder.
    help_string: the flag's help.
    flag_values: where the flag is defined (absl's global FLAGS by default).
    protocols: the protocols whose configs the entry point runs; () = the
      default's alone.

  Returns:
    The flag's holder; `.value` is the ConfigDict.
  """
  # Loaded for its protocol: an entry point takes the configs of its
  # default's protocol unless it names the protocols it runs.
  protocols = tuple(protocols) or (protocol_of(_load(default)),)
  mine = presets_of(protocols)
  example = default if default in mine else mine[0]
  # Overrides are read from the command line command_line.parse_flags
  # checked (it fills this list), never at import time.
  checked = []
  holder = config_flags.DEFINE_config_file(
      name, resolve(default), f'{help_string} A packaged preset ({", ".join(mine)}; '
      f'e.g. --{name}={example}:scale=tiny) or the path to a get_config file.',
      flag_values=flag_values, sys_argv=checked)
  flag = flag_values[name]
  flag.parser = _PresetParser(flag.parser, protocols)
  flag.checked_argv = checked
  # A key flag of the entry point's module, so that its --help lists it
  # (absl lists the main module's own and key flags; this one is defined in
  # ml_collections' module). absl names the main module by sys.argv[0].
  caller = sys._getframe(1).f_globals.get('__name__')  # pylint: disable=protected-access
  flag_values.register_key_flag_for_module(sys.argv[0] if caller == '__main__' else caller,
                                           flag)
  return holder
