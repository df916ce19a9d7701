"""Published scores on the suite, beside ours in summary.md and the README."""

RUOSS_2023_SOURCE = 'not yet transcribed'
_RUOSS_2023 = {}


def ruoss_2023(task: str, encoding: str):
  """Ruoss et al. 2023 Table 1's accuracy (%) for `task` × `encoding` (our
  spec names), or None where it has none."""
  return _RUOSS_2023.get((task, encoding))
