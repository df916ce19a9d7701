"""The one parser of a config file's preset argument, `--config=FILE:ARG`:
comma-separated `key=value`, e.g. `configs/copy.py:encoding=rope,scale=tiny`.

Every config file (configs/*.py) declares its keys and their defaults, the
keys whose value is one of a fixed set, and the keys that take a list
written `A+B`; `parse` checks an argument against them and returns the
values. A key that is not declared, a missing `=`, an empty value, a value
outside its set or a list naming one item twice is a `ValueError` naming
the item and what is allowed, raised before the config is built.
"""

from typing import Mapping, Optional, Sequence


def parse(arg: Optional[str], defaults: Mapping[str, Optional[str]], *, example: str,
          choices: Mapping[str, Sequence[str]] = (),
          lists: Sequence[str] = (),
          renamed: Mapping[str, str] = ()) -> dict:
  """The preset values of `arg` over `defaults` (key -> default value).

  Args:
    arg: the text after `FILE:` (None or '' for the defaults).
    defaults: every key the file takes, with its default.
    example: a whole `FILE:ARG` shown in the messages.
    choices: key -> the values it takes.
    lists: keys written `A+B`; their values come back as tuples (the default
      stays as given).
    renamed: key -> what replaced it, for keys a file no longer takes.
  """
  values = dict(defaults)
  choices, renamed = dict(choices), dict(renamed)
  for item in filter(None, (arg or '').split(',')):
    key, eq, value = item.partition('=')
    if key in renamed:
      raise ValueError(f'config argument {item!r}: {key}= is now {renamed[key]}, e.g. '
                       f'{example}.')
    if key not in values or not eq:
      raise ValueError(f'bad config argument {item!r}; expected key=value with key in '
                       f'{sorted(values)}, e.g. {example}.')
    if not value:
      what = 'name at least one (A+B)' if key in lists else 'give a value'
      raise ValueError(f'bad config argument {item!r}: {key}= is empty; {what}, or leave '
                       f'{key} out for the default.')
    if key in choices and value not in choices[key]:
      raise ValueError(f"{key}={value!r}: choose {', '.join(choices[key])}.")
    if key in lists:
      names = value.split('+')
      twice = sorted({n for n in names if names.count(n) > 1 or not n})
      if twice:
        raise ValueError(f'bad config argument {item!r}: {key}= names {twice} more than once '
                         'or empty; write distinct names joined by +.')
      value = tuple(names)
    values[key] = value
  return values
