"""A `--workdir` before anything runs, and after a start that failed.

`check_workdir` refuses one that cannot hold the outputs, by a real write;
`refuse_another_kind` one that holds another entry point's results (their
results.csv and summary.md would be replaced); `remove_partial` removes
what an invocation made and did not finish (out of memory at the first
compile), keeping finished checkpoints and what was there before
(`folders`).
"""

import glob
import json
import os
import shutil
import tempfile
from typing import Optional

from attention_jax.lab.errors import ConfigError

# What makes each kind of workdir (`held`).
MADE_BY = {
    'study': "a decoder study (a config of protocol 'decoder')",
    'suite': "DeepMind's suite (a config of protocol 'encoder')",
    'run': 'one run (experiments.train)',
}


def held(path: str) -> Optional[str]:
  """The kind of workdir `path` is already, by what it holds: 'suite' (its
  settings/, or a top config.json recording the suite's identity), 'study'
  (runs in TASK/LABEL/seedN/, in either layout, or a results.csv without a
  top config.json), 'run' (a top config.json of one run); None for a
  folder that is none of them (new, or empty)."""
  if not os.path.isdir(path):
    return None
  top = os.path.join(path, 'config.json')
  if os.path.isdir(os.path.join(path, 'settings')):
    return 'suite'
  for layout in ('', 'runs'):
    if glob.glob(os.path.join(glob.escape(path), layout, '*', '*', 'seed*', 'config.json')):
      return 'study'
  if os.path.exists(top):
    try:
      with open(top) as f:
        stored = json.load(f)
    except (OSError, ValueError):
      stored = None  # damaged: the checks of the run it belongs to name it
    return 'suite' if isinstance(stored, dict) and 'identity' in stored else 'run'
  return 'study' if os.path.exists(os.path.join(path, 'results.csv')) else None


def refuse_another_kind(path: str, kind: str) -> None:
  """Refuses a `--workdir` that holds another kind's results (`held`): a
  workdir holds one kind of run, and this one's results.csv and summary.md
  would replace the other's.

  Raises:
    ConfigError: naming what the workdir holds and what this command writes.
  """
  found = held(path)
  if found is not None and found != kind:
    raise ConfigError(f'--workdir={path} holds {MADE_BY[found]}; this command writes '
                      f'{MADE_BY[kind]}, whose results.csv and summary.md would replace '
                      "that one's: a workdir holds one kind of run; use another --workdir.")


def check_workdir(path: str) -> None:
  """Refuses a --workdir that is a file, or that cannot be written (itself,
  or the folder it would be made in), before anything runs.

  The folder is made and removed again (with the folders above it that it
  needed), and an existing one gets a probe file: permission bits do not
  tell (root passes `os.access` on a read-only or virtual filesystem such
  as /proc), only a real write does. Nothing is left behind.

  Raises:
    ConfigError: naming the path and what is wrong with it.
  """
  if not path.strip():
    raise ConfigError(f'--workdir={path!r} is empty; name the folder to write into, '
                      'e.g. --workdir=runs/study.')
  if os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError(f'--workdir={path!r} is a file; it must be a folder (or not exist yet).')
  existing = os.path.abspath(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise ConfigError(f'--workdir={path!r}: {existing!r} is a file, so the folder cannot be made.')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise ConfigError(f'--workdir={path!r}: {existing!r} is not writable; choose a folder '
                      'you can write to.')
  try:
    _probe_write(os.path.abspath(path), existing)
  except OSError as e:
    raise ConfigError(f'--workdir={path!r} cannot be written ({e.strerror or e}, under '
                      f'{existing!r}); choose a folder you can write to.') from None


def _probe_write(path: str, existing: str) -> None:
  """Makes `path` (under `existing`, the deepest folder that exists) and a
  file in it, then removes what it made."""
  made = path if path != existing else None
  if made:
    os.makedirs(path)
  try:
    fd, probe = tempfile.mkstemp(dir=path, prefix='.write-probe-')
    os.close(fd)
    os.remove(probe)
  finally:
    while made and made != existing:
      os.rmdir(made)
      made = os.path.dirname(made)


def folders(root: str) -> set:
  """Every folder under `root` (itself included), or none if it does not exist."""
  return {d for d, _, _ in os.walk(root)} if os.path.isdir(root) else set()


def _holds_checkpoint(folder: str) -> bool:
  """Whether a finished checkpoint (orbax's checkpoints/STEP) lies under `folder`."""
  return any(os.path.basename(d) == 'checkpoints' and any(n.isdigit() for n in names)
             for d, names, _ in os.walk(folder))


def remove_partial(root: str, before: set) -> None:
  """Removes the folders under `root` (itself included) that were not in
  `before` and hold no finished checkpoint: what a run that failed at its
  start (out of memory at the first compile) left behind."""
  if not os.path.isdir(root):
    return
  if root not in before and not _holds_checkpoint(root):
    shutil.rmtree(root, ignore_errors=True)
    return
  for entry in os.scandir(root):
    if entry.is_dir(follow_symlinks=False):
      remove_partial(entry.path, before)
