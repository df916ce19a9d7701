"""One process at a time per run directory (and per workdir's outputs).

Two jobs pointed at one run directory would both write its checkpoints
(orbax fails half-way: `NOT_FOUND … zarr`) and its metrics. `hold(run_dir)`
takes an OS file lock (`fcntl.flock`) on `run_dir/.lock` and writes the
holder (`host pid N since TIME`) into it; a second process either refuses
with one line naming the holder (`RunLocked`) or, with `wait=True`, polls
until the holder is done. The kernel drops a flock when its process dies, so
a lock file left by a killed job never blocks: the file stays (removing it
would race with a new holder), its text is only a name.

Holds are re-entrant within one thread (the study holds a run over training,
evaluation and writes; `train` inside it holds it again) and exclusive
between threads of one process, as between processes. In a multi-host job
(`jax.distributed`) process 0 holds the locks for all its processes.

On a cluster the lock needs a filesystem that supports flock (NFSv4, GPFS,
Lustre mounted with `flock`); one that does not is a `ConfigError` naming the
file, not a silent unlocked run.
"""

import contextlib
import datetime
import errno
import fcntl
import os
import socket
import threading
import time
from typing import Callable, Iterator, Optional

import jax

from attention_jax.lab.errors import ConfigError

LOCK_FILE = '.lock'
POLL_SECONDS = 1.0  # how often a waiting process tries again

# Locks this process holds: path -> [owning thread id, depth, open file].
_held: dict = {}
_registry = threading.Lock()


class RunLocked(ConfigError):
  """Another process (or thread) holds the lock. `holder`: its line."""

  def __init__(self, path: str, holder: str):
    where = os.path.dirname(path)
    super().__init__(f'{where} is in use by {holder} (lock {path}); wait for it to finish, '
                     'or pass --config.study.on_locked=wait to wait for it.')
    self.holder = holder


def holder_line() -> str:
  """What this process writes into a lock it takes."""
  since = datetime.datetime.now().astimezone().isoformat(timespec='seconds')
  return f'host {socket.gethostname()} pid {os.getpid()} since {since}'


def read_holder(path: str) -> str:
  """The holder's line in `path` (a holder writes it right after locking:
  an empty file is one that has not yet)."""
  for _ in range(3):
    try:
      with open(path) as f:
        text = f.read().strip()
    except OSError:
      text = ''
    if text:
      return text
    time.sleep(0.05)
  return 'another process (not yet named in the lock file)'


def _try_flock(path: str):
  """The open lock file if this call got the lock, else None."""
  f = open(path, 'a+')  # never truncates: the holder's line stays readable
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    f.close()
    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
      return None
    raise ConfigError(f'cannot lock {path}: {e.strerror} (errno {e.errno}); the filesystem '
                      'must support flock (NFSv4, GPFS, Lustre mounted with -o flock).') from None
  f.seek(0)
  f.truncate()
  f.write(holder_line() + '\n')
  f.flush()
  return f


def _acquire(path: str) -> Optional[str]:
  """Takes `path` for this thread; None on success, else the holder's line."""
  me = threading.get_ident()
  with _registry:
    entry = _held.get(path)
    if entry is not None:
      if entry[0] != me:
        return f'another thread of this process ({holder_line()})'
      entry[1] += 1
      return None
    f = _try_flock(path)
    if f is None:
      return read_holder(path)
    _held[path] = [me, 1, f]
    return None


def _release(path: str) -> None:
  with _registry:
    entry = _held[path]
    entry[1] -= 1
    if entry[1] == 0:
      del _held[path]
      entry[2].close()  # closing the only descriptor releases the flock


@contextlib.contextmanager
def hold(directory: str, *, wait: bool = False,
         log: Optional[Callable[[str], None]] = None,
         should_stop: Optional[Callable[[], None]] = None,
         name: str = LOCK_FILE) -> Iterator[str]:
  """Holds `directory/name` (creating `directory`) for the `with` block;
  yields the lock file's path.

  Held elsewhere: `RunLocked` naming the holder, or with `wait` one line to
  `log` and a retry every `POLL_SECONDS`, calling `should_stop()` between
  tries (it raises to give up: a stop request)."""
  os.makedirs(directory, exist_ok=True)
  path = os.path.abspath(os.path.join(directory, name))
  if jax.process_index() != 0:  # one job over several hosts: process 0 holds it
    yield path
    return
  holder = _acquire(path)
  announced = False
  while holder is not None:
    if not wait:
      raise RunLocked(path, holder)
    if log and not announced:
      log(f'{directory} is in use by {holder}; waiting for it')
      announced = True
    if should_stop:
      should_stop()
    time.sleep(POLL_SECONDS)
    holder = _acquire(path)
  try:
    yield path
  finally:
    _release(path)


@contextlib.contextmanager
def hold_all(directories: list[str], **kwargs) -> Iterator[None]:
  """`hold` on every directory, in sorted order (two processes asking for
  overlapping sets never deadlock); a refusal releases those taken."""
  with contextlib.ExitStack() as stack:
    for directory in sorted(set(directories)):
      stack.enter_context(hold(directory, **kwargs))
    yield



def waits(config) -> bool:
  """Whether `config` asks to wait for a held run directory
  (`study.on_locked='wait'`) rather than refuse it ('refuse', the default)."""
  study = config.get('study') or {}
  return study.get('on_locked', 'refuse') == 'wait'
