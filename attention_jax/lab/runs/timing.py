"""Where a study's seconds go, and setups run side by side to spend fewer.

`Stopwatch`: wall time per stage and XLA's compile time in it.
`side_by_side`: several setups at once, in threads.

A study is many small programs, so compiling them is a large share of the
wall time; `Stopwatch` keeps it apart from running them by listening to
JAX's own compile event while a stage runs.
"""

import collections
import concurrent.futures
import contextlib
import threading
import time

import jax

# Recorded by JAX once per program XLA compiles (not for a cache hit).
_COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'


class Stopwatch:
  """Wall seconds per named stage, and the XLA compile seconds inside each.

  with clock.stage('train'): ...   # stages may repeat; they add up
  clock.breakdown(share=3)         # {'train': s, 'train_compile': s, …} / 3

  Compiles are counted in the thread that entered the stage only, so setups
  running side by side in threads keep their own.
  """

  def __init__(self):
    self.wall: collections.Counter = collections.Counter()
    self.compile: collections.Counter = collections.Counter()

  @contextlib.contextmanager
  def stage(self, name: str):
    thread = threading.get_ident()  # XLA compiles in the thread that calls

    def listener(event, duration, **_):
      if event == _COMPILE_EVENT and threading.get_ident() == thread:
        self.compile[name] += duration

    jax.monitoring.register_event_duration_secs_listener(listener)
    start = time.perf_counter()
    try:
      yield
    finally:
      self.wall[name] += time.perf_counter() - start
      jax.monitoring.unregister_event_duration_listener(listener)

  def breakdown(self, share: int = 1) -> dict[str, float]:
    """Seconds per stage and `STAGE_compile` per stage, divided by `share`
    (the runs one program computed together, e.g. the seeds of a setup)."""
    out = {}
    for name, seconds in self.wall.items():
      out[name] = seconds / share
      out[f'{name}_compile'] = self.compile[name] / share
    return out


def describe(info: dict) -> str:
  """'train 70s, evaluation 12s, generation 9s (compiling 25s of them)': one
  run's share."""
  times = info.get('time_breakdown') or dict(train=info['train_seconds'],
                                             evaluation=info['eval_seconds'])
  stages = [k for k in ('train', 'evaluation', 'generation') if k in times]
  compiling = sum(times.get(f'{k}_compile', 0.0) for k in stages)
  return (', '.join(f'{k} {times[k]:.0f}s' for k in stages)
          + f' (compiling {compiling:.0f}s of them)')


class _NotStarted(Exception):
  """A job skipped because another had failed."""


def side_by_side(fn, jobs: list, workers: int, combine=None) -> list:
  """`[fn(job) for job in jobs]`, up to `workers` jobs at a time in threads.

  XLA runs the programs of two threads at once: on a 2-core CPU one small
  setup's programs leave much of the second core idle, which another
  setup's fill. Each job is one setup, written to its own run directories.
  On an error (or a stop request) no new job starts; the running ones end
  at their next stop check or finish, and the first error is raised — or,
  with several and `combine` given, `combine(errors)` (in job order), so
  that a stop that ended two setups reports both.
  """
  if workers <= 1 or len(jobs) <= 1:
    return [fn(job) for job in jobs]
  failed = threading.Event()

  def guarded(job):
    if failed.is_set():  # a thread freed by the failure: start nothing new
      raise _NotStarted()
    try:
      return fn(job)
    except BaseException:
      failed.set()  # before this thread takes the next job
      raise

  with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix='setup') as pool:
    futures = [pool.submit(guarded, job) for job in jobs]
    concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
    for future in futures:
      future.cancel()  # not started yet: never starts
    concurrent.futures.wait(futures)
  errors = [f.exception() for f in futures if not f.cancelled()
            and f.exception() is not None and not isinstance(f.exception(), _NotStarted)]
  if len(errors) > 1 and combine is not None:
    raise combine(errors)
  if errors:  # the first error in sweep order
    raise errors[0]
  return [future.result() for future in futures]


def locked(lock, fn, *args):
  with lock:
    return fn(*args)
