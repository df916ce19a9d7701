"""`tiers.fast_cases` moves exactly the cases past its count to the slow tier,
for each kind of absl sweep, and the two tiers together run every case."""

import os
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest

TESTS = os.path.dirname(os.path.abspath(__file__))

SAMPLE = '''
import chex
from absl.testing import parameterized
from tests import tiers


class Sample(chex.TestCase, parameterized.TestCase):

  @parameterized.product(kernel=('a', 'b', 'c'), dtype=(1, 2))
  @tiers.fast_cases(2)
  def test_product(self, kernel, dtype):
    pass

  @parameterized.named_parameters(('zeta', 1), ('alpha', 2), ('mid', 3))
  @tiers.fast_cases(1)
  def test_named(self, value):
    pass

  @parameterized.parameters(*range(12))
  @tiers.fast_cases(3)
  def test_numbered(self, value):
    pass

  @chex.variants(with_jit=True)
  @parameterized.parameters(1, 2, 3)
  @tiers.fast_cases(2)
  def test_variant(self, value):
    pass

  def test_plain(self):
    pass
'''


class FastCasesTest(absltest.TestCase):

  def _collect(self, root, marker):
    proc = subprocess.run(
        [sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', '--collect-only', '-q',
         '-m', marker, 'tests/test_sample.py'], cwd=root, capture_output=True, text=True)
    self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
    return {line.rsplit('::', 1)[1] for line in proc.stdout.splitlines() if '::' in line}

  def test_tiers_keep_the_first_cases_fast_and_the_rest_slow(self):
    root = tempfile.mkdtemp()
    os.makedirs(os.path.join(root, 'tests'))
    for name in ('__init__.py', 'conftest.py', 'tiers.py'):
      shutil.copy(os.path.join(TESTS, name), os.path.join(root, 'tests', name))
    with open(os.path.join(root, 'tests', 'test_sample.py'), 'w') as f:
      f.write(SAMPLE)
    fast = self._collect(root, 'not slow')
    slow = self._collect(root, 'slow')
    variant = lambda value: f'test_variant_({value})__with_jit'
    self.assertEqual(fast, {'test_product0', 'test_product1', 'test_named_zeta',
                            'test_numbered0', 'test_numbered1', 'test_numbered2', 'test_plain',
                            variant(1), variant(2)})
    self.assertEqual(slow, {'test_product2', 'test_product3', 'test_product4', 'test_product5',
                            'test_named_alpha', 'test_named_mid', variant(3)} |
                     {f'test_numbered{i}' for i in range(3, 12)})

  def test_tiers_refuse_a_count_below_one(self):
    from tests import tiers  # pylint: disable=g-import-not-at-top
    for bad in (0, -1, 1.5, '2'):
      with self.assertRaisesRegex(ValueError, 'count >= 1'):
        tiers.fast_cases(bad)


if __name__ == '__main__':
  absltest.main()
