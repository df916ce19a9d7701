"""The lab's errors, in a room of their own so that any module can raise
them without importing what validates a config (the task registry, the
encodings' probes).

`ConfigError` is a config or command line that cannot run, found before
anything is created: the entry points print its one line and exit with
status 2 (`lab.runs.process.entry_point`).
"""


class ConfigError(ValueError):
  """A config that cannot run, found before anything is created."""
