"""Turning SIGTERM and Ctrl-C into a clean stop at the next step boundary."""

import contextlib
import signal
import threading
import types


class TrainingInterrupted(Exception):
  """Raised by the training loop after it saved a checkpoint on a stop request.

  `args[1]` is the signal number, or None for `train.stop_after`.
  """

  @property
  def exit_code(self) -> int:
    """128 + signal, the shell's convention (0 for a planned stop)."""
    return 128 + self.args[1] if self.args[1] else 0


@contextlib.contextmanager
def stop_requests():
  """Yields a flag whose `.signal` becomes the signal number on SIGINT or
  SIGTERM; the loop checks it between steps. A second signal of the same kind
  gets the previous handler (a second Ctrl-C still kills a stuck run).
  Outside the main thread, where handlers cannot be installed, the flag stays
  None."""
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
  try:
    yield flag
  finally:
    for s in signals:
      signal.signal(s, previous[s])
