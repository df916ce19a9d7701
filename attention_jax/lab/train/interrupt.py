"""SIGTERM and Ctrl-C as a stop request, honoured wherever it arrives.

One scope (`stop_requests`) covers a whole job: the study, a run's training,
its final writes, its evaluation, the gaps between runs. Scopes nest: an
inner one (the training loop's) shares the outermost one's flag, so a signal
that arrives after the loop's last check is still seen by the next check
(`raise_if_stopped`, before evaluation, between lengths, between runs). A
signal that arrives after the last check of the outermost scope is raised when
that scope ends: a stop is never dropped.
"""

import contextlib
import signal
import threading
import types
from typing import Optional


class TrainingInterrupted(Exception):
  """A stop request honoured: raised after what was done so far is saved.

  `args[0]` is the message, `args[1]` the signal number, or None for
  `train.stop_after` and `train.max_minutes`; `args[2]`, when given, the exit
  status (`TIME_BUDGET` for `train.max_minutes`).
  """

  @property
  def exit_code(self) -> int:
    """128 + signal, the shell's convention (0 for `train.stop_after`,
    `TIME_BUDGET` for `train.max_minutes`)."""
    if len(self.args) > 2:
      return self.args[2]
    return 128 + self.args[1] if self.args[1] else 0


# Exit status of a job stopped by its time budget (`train.max_minutes`), its
# work checkpointed: sysexits' EX_TEMPFAIL, "try again". The same command
# continues, so a cluster job requeues itself on it.
TIME_BUDGET = 75


_RESUME = 'run the same command again to resume.'
# The flag of the outermost scope (None outside any scope), shared by the
# threads of a study that runs setups side by side.
_active = types.SimpleNamespace(flag=None)
# What each thread is doing, for the message of a stop outside the training loop.
_stages = threading.local()


@contextlib.contextmanager
def stop_requests():
  """Yields a flag whose `.signal` becomes the signal number on SIGINT or
  SIGTERM. A second signal of the same kind gets the previous handler (a
  second Ctrl-C still kills a stuck job). Outside the main thread, where
  handlers cannot be installed, the flag stays None. Nested scopes share the
  outermost flag; the outermost raises `TrainingInterrupted` on a normal exit
  if a signal arrived that nothing acted on."""
  if _active.flag is not None:
    yield _active.flag
    return
  flag = types.SimpleNamespace(signal=None)
  if threading.current_thread() is not threading.main_thread():
    yield flag
    return
  signals = (signal.SIGINT, signal.SIGTERM)
  previous = {s: signal.getsignal(s) for s in signals}

  def handler(signum, frame):
    del frame
    flag.signal = signum
    signal.signal(signum, previous[signum])

  for s in signals:
    signal.signal(s, handler)
  _active.flag = flag
  try:
    yield flag
  finally:
    _active.flag = None
    for s in signals:
      signal.signal(s, previous[s])
  if flag.signal:  # only on a normal exit: an exception in flight wins
    raise TrainingInterrupted(
        f'stopped by signal {flag.signal} after the work had finished; every output '
        'is written.', flag.signal)


@contextlib.contextmanager
def stage(description: str):
  """Names what the job does meanwhile ('during the evaluation of …'), for
  the message of a stop `raise_if_stopped` honours."""
  previous, _stages.description = _current_stage(), description
  try:
    yield
  finally:
    _stages.description = previous


def _current_stage() -> str:
  return getattr(_stages, 'description', 'while working')


def stop_signal() -> Optional[int]:
  """The signal received in the current scope, or None."""
  return _active.flag.signal if _active.flag is not None else None


def raise_if_stopped(where: Optional[str] = None) -> None:
  """Raises `TrainingInterrupted` if a stop was requested in this scope;
  `where` (default: the current `stage`) goes into the message."""
  signum = stop_signal()
  if signum:
    raise TrainingInterrupted(
        f'stopped by signal {signum} {where or _current_stage()}; {_RESUME}', signum)


def combined(errors: list) -> Exception:
  """One error for several jobs that ended at once (setups side by side):
  when every one is a `TrainingInterrupted`, one with all their messages
  (each says where its checkpoints are) and the first's signal; else the
  first error."""
  if not all(isinstance(e, TrainingInterrupted) for e in errors):
    return errors[0]
  tail = f'; {_RESUME}'
  parts = [e.args[0].removesuffix(tail) for e in errors]
  resume = tail if any(e.args[0].endswith(tail) for e in errors) else ''
  return TrainingInterrupted('; and '.join(parts) + resume, *errors[0].args[1:])
