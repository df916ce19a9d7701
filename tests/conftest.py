"""The suite cleans up after itself: every temporary folder a test makes
(`tempfile.mkdtemp`, and those of the processes it starts, through TMPDIR)
lies under one folder per test process, removed when that process ends."""

import os
import shutil
import tempfile

_KEY = 'ATTENTION_JAX_TEST_TMPDIR'


def pytest_configure(config):
  del config
  previous = os.environ.get('TMPDIR')
  folder = tempfile.mkdtemp(prefix='attention_jax-tests-')
  os.environ[_KEY] = folder
  os.environ[_KEY + '_PREVIOUS'] = previous or ''
  os.environ['TMPDIR'] = folder
  tempfile.tempdir = folder


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
