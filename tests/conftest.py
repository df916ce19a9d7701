"""What every test process shares.

* The slow tier is the `slow` marker: `make test` runs `-m "not slow"`,
  `.ci/run` then `-m slow` (process-level tests that train several tiny
  models, a wheel installed away from the clone, and the cases of a sweep
  past its `tiers.fast_cases` count).
* One persistent XLA compilation cache (`.jax_cache/` in the clone, ignored
  by git): the suite's processes compile the same small programs many times
  over, and a rerun finds them compiled.
* The suite cleans up after itself: every temporary folder a test makes
  (`tempfile.mkdtemp`, and those of the processes it starts, through TMPDIR)
  lies under one folder per test process, removed when that process ends.
"""

import inspect
import os
import shutil
import tempfile

import pytest

_KEY = 'ATTENTION_JAX_TEST_TMPDIR'


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Read by JAX when it is imported (here first, and in every process a test
# starts, through the environment); every program is cached, however fast.
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(_ROOT, '.jax_cache'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')


def pytest_configure(config):
  config.addinivalue_line('markers', 'slow: the slow tier (.ci/run runs it; make test does not)')
  previous = os.environ.get('TMPDIR')
  folder = tempfile.mkdtemp(prefix='attention_jax-tests-')
  os.environ[_KEY] = folder
  os.environ[_KEY + '_PREVIOUS'] = previous or ''
  os.environ['TMPDIR'] = folder
  tempfile.tempdir = folder


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
  """The cases of a `tiers.fast_cases(n)` sweep from the n-th on join the slow tier."""
  del config
  for item in items:
    count = getattr(getattr(item, 'function', None), 'fast_cases', None)
    if count is not None and _case_index(item) >= count:
      item.add_marker(pytest.mark.slow)


def _case_index(item) -> int:
  """Where a parameterized case comes in its sweep: absl (and chex's variants
  over it) add the cases to the class in the order the decorator lists them,
  each wrapping the one test function."""
  cls = next(c for c in item.cls.__mro__ if item.name in vars(c))
  test = _sweep_of(vars(cls)[item.name])
  cases = [name for name, member in vars(cls).items()
           if callable(member) and _sweep_of(member) == test]
  return cases.index(item.name)


def _sweep_of(member):
  original = inspect.unwrap(member)
  return original.__module__, original.__qualname__


def pytest_unconfigure(config):
  del config
  folder = os.environ.pop(_KEY, None)
  previous = os.environ.pop(_KEY + '_PREVIOUS', '')
  if previous:
    os.environ['TMPDIR'] = previous
  else:
    os.environ.pop('TMPDIR', None)
  tempfile.tempdir = None
  if folder:
    shutil.rmtree(folder, ignore_errors=True)
