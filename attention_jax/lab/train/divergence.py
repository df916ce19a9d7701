"""A diverged run: its training loss became NaN or infinite.

The loop looks at the loss where it syncs with the host anyway (every
`train.log_every` steps), so a diverged run stops at most that many steps
after its first non-finite loss. Its checkpoints are kept as they are (none
is added after it is seen), and `diverged.json` in its run directory
records the first non-finite step. A diverged run is still evaluated (its
rows carry the step in results.csv's `diverged_at` column), but the study's
tables and figure leave it out of every mean and count it, and the entry
points exit with `DIVERGED` once everything else is done, so that neither a
table nor a script can take it for a model that failed to extrapolate.

A rerun does not train it again: training is deterministic in the config
and seed, so the same config diverges again at the same step; it is kept as
diverged, and said so. To train it with other settings, use a new --workdir
(or delete its run directory).
"""

import json
import math
import os
from typing import Optional, Sequence

FILE = 'diverged.json'
DIVERGED = 3  # the entry points' exit status when a run diverged


def first_nonfinite(losses: Sequence[float]) -> Optional[int]:
  """Index of the first loss that is NaN or infinite, or None."""
  return next((i for i, x in enumerate(losses) if not math.isfinite(x)), None)


def record(run_dir: Optional[str], step: int, loss: float) -> None:
  """Writes `diverged.json` (the first non-finite step and its loss) atomically."""
  if not run_dir:
    return
  path = os.path.join(run_dir, FILE)
  with open(path + '.tmp', 'w') as f:
    json.dump(dict(step=int(step), loss=str(loss)), f)
  os.replace(path + '.tmp', path)


def diverged_at(run_dir: Optional[str]) -> Optional[int]:
  """The step at which the run in `run_dir` diverged, or None if it did not.
  A `diverged.json` that does not read back counts as diverged at step -1
  (unknown) with a warning naming it: never as a healthy run."""
  path = os.path.join(run_dir, FILE) if run_dir else None
  if not path or not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return int(json.load(f)['step'])
  except (OSError, ValueError, KeyError, TypeError) as e:
    print(f'warning: {path} does not read back ({e}); the run counts as diverged at an '
          'unknown step (-1).', flush=True)
    return -1


def diverged_rows(rows: Sequence[dict]) -> dict:
  """{(task, encoding, seed): step} of the rows' diverged runs."""
  return {(r['task'], r['encoding'], r['seed']): r['diverged_at'] for r in rows
          if r.get('diverged_at') is not None}


def message(rows: Sequence[dict]) -> Optional[str]:
  """The entry points' last line for rows holding diverged runs; None if none."""
  found = diverged_rows(rows)
  if not found:
    return None
  runs = ', '.join(f'{t}/{e} seed {s} at step {step}' for (t, e, s), step in sorted(found.items()))
  return (f'error: {len(found)} run(s) diverged (non-finite training loss): {runs}; they are '
          f'marked in results.csv (diverged_at) and left out of the means. Exit status '
          f'{DIVERGED}. A rerun keeps them as diverged; train them with other settings in a new '
          '--workdir.')
