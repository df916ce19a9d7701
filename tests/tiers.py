"""The slow tier: tests `make test` leaves out for its time (about 8 minutes
on 2 cores is the budget) and `.ci/run` runs after it, with
ATTENTION_JAX_SLOW_TESTS=1. Process-level tests that train several tiny
models go here; every behaviour they check also has a faster test in
`make test` or is a whole-command check (two processes at once, a plot of
every workdir kind)."""

import os

from absl.testing import absltest

SLOW_TESTS = 'ATTENTION_JAX_SLOW_TESTS'
RUN_SLOW = os.environ.get(SLOW_TESTS) == '1'

# A decorator for a test or a test class.
slow = absltest.skipUnless(RUN_SLOW, f'slow tier; {SLOW_TESTS}=1 runs it (.ci/run does)')
