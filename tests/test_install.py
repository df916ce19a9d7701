"""A non-editable install runs the experiments from any folder.

Builds a wheel from a copy of the tree, installs it with `pip --target`
(the test's interpreter already holds the dependencies), and runs the
console scripts from a temporary folder with only the install on
PYTHONPATH: the tiny study writes its results, and a preset that is
neither a file nor packaged is one line and exit status 2.
"""

import csv
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from absl.testing import absltest
import pytest

from attention_jax.lab.config import presets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the wheel is built from; everything else in the tree stays out of it.
SOURCES = ('pyproject.toml', 'README.md', 'attention_jax', 'experiments', 'configs')
# The tree's folders and where the wheel puts them.
SHIPPED = {'attention_jax': 'attention_jax', 'experiments': 'attention_jax/experiments',
           'configs': 'attention_jax/configs'}


def _pip(*args, cwd):
  result = subprocess.run([sys.executable, '-m', 'pip', *args, '--quiet'], cwd=cwd,
                          capture_output=True, text=True, check=False)
  if result.returncode:
    raise AssertionError(f'pip {" ".join(args)} failed:\n{result.stderr}')


class PresetsTest(absltest.TestCase):
  """Preset names and paths, in the clone (no install needed)."""

  def test_preset_names_resolve_to_the_packaged_files(self):
    copy = os.path.join(presets.presets_dir(), 'copy.py')
    for spec in ('copy:scale=tiny', 'copy.py:scale=tiny', 'configs/copy.py:scale=tiny'):
      with self.subTest(spec=spec):
        cwd = os.getcwd()
        os.chdir(tempfile.mkdtemp())  # no configs/copy.py here
        try:
          self.assertEqual(presets.resolve(spec), copy + ':scale=tiny')
        finally:
          os.chdir(cwd)
    self.assertEqual(presets.available(), ['addition', 'chomsky', 'copy', 'flipflop', 'seq2seq'])

  def test_an_existing_file_is_used_as_given(self):
    path = os.path.join(tempfile.mkdtemp(), 'copy.py')
    open(path, 'w').close()
    self.assertEqual(presets.resolve(f'{path}:scale=tiny'), f'{path}:scale=tiny')

  def test_unknown_preset_names_it_and_the_presets(self):
    with self.assertRaisesRegex(ValueError, r"'nope'.*presets: addition, chomsky, copy, flipflop, seq2seq"):
      presets.resolve('nope:scale=tiny')
    with self.assertRaisesRegex(ValueError, r"'elsewhere/copy.py'"):
      presets.resolve('elsewhere/copy.py')  # a folder other than configs/ is a path


# About a minute on a 2-core CPU (a wheel, an install, a tiny study): the slow
# tier (`.ci/run` runs it after `make test`, which leaves it out).
@pytest.mark.slow
class InstalledTest(absltest.TestCase):
  """The wheel, installed non-editable, away from the clone."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp()
    cls.tree = tree = os.path.join(cls.tmp, 'tree')
    for name in SOURCES:
      source, target = os.path.join(ROOT, name), os.path.join(tree, name)
      if os.path.isdir(source):
        shutil.copytree(source, target, ignore=shutil.ignore_patterns(
            '__pycache__', '*.egg-info', 'build'))
      else:
        os.makedirs(tree, exist_ok=True)
        shutil.copy(source, target)
    wheels = os.path.join(cls.tmp, 'wheels')
    _pip('wheel', '--no-deps', '--no-build-isolation', '-w', wheels, tree, cwd=cls.tmp)
    (wheel,) = os.listdir(wheels)
    cls.wheel = os.path.join(wheels, wheel)
    cls.target = os.path.join(cls.tmp, 'site')
    _pip('install', '--no-deps', '--target', cls.target, cls.wheel, cwd=cls.tmp)
    cls.away = os.path.join(cls.tmp, 'elsewhere')  # the current folder: no clone in sight
    os.makedirs(cls.away)
    cls.env = dict(os.environ, PYTHONPATH=cls.target)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def _script(self, name, *args):
    return subprocess.run([os.path.join(self.target, 'bin', name), *args], cwd=self.away,
                          env=self.env, capture_output=True, text=True, check=False)

  def test_wheel_holds_every_module_under_the_package_name(self):
    with zipfile.ZipFile(self.wheel) as wheel:
      names = set(wheel.namelist())
    missing = []
    for folder, shipped in SHIPPED.items():
      # The copy the wheel was built from, not the tree as it is now.
      for parent, dirs, files in os.walk(os.path.join(self.tree, folder)):
        dirs[:] = [d for d in dirs if d != '__pycache__']
        for f in files:
          if f.endswith('.py'):
            relative = os.path.relpath(os.path.join(parent, f), os.path.join(self.tree, folder))
            if f'{shipped}/{relative}'.replace(os.sep, '/') not in names:
              missing.append(os.path.join(folder, relative))
    self.assertEqual(missing, [], 'modules left out of the wheel: add their package to '
                     "pyproject.toml's [tool.setuptools] packages")
    # No generic top-level packages in site-packages.
    self.assertEqual(sorted({n.split('/')[0] for n in names if '.dist-info' not in n}),
                     ['attention_jax'])

  def test_installed_package_finds_its_own_presets(self):
    code = ('import importlib.util, attention_jax; from attention_jax.lab.config import presets; '
            'print(attention_jax.__file__); print(presets.resolve("copy")); '
            'print(importlib.util.find_spec("configs"), importlib.util.find_spec("experiments"))')
    result = subprocess.run([sys.executable, '-c', code], cwd=self.away, env=self.env,
                            capture_output=True, text=True, check=False)
    self.assertEqual(result.returncode, 0, result.stderr)
    package, preset, top_level = result.stdout.splitlines()
    self.assertTrue(package.startswith(self.target), package)
    self.assertEqual(preset, os.path.join(self.target, 'attention_jax', 'configs', 'copy.py'))
    self.assertEqual(top_level, 'None None')

  def test_tiny_study_runs_from_another_folder(self):
    workdir = os.path.join(self.away, 'runs', 'tiny')
    result = self._script('attention-jax-study', '--config=copy:scale=tiny',
                          '--config.study.encodings=("alibi",)', '--config.study.seeds=(0,)',
                          f'--workdir={workdir}')
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    with open(os.path.join(workdir, 'results.csv')) as f:
      rows = list(csv.DictReader(f))
    self.assertNotEmpty(rows)
    self.assertEqual({r['encoding'] for r in rows}, {'alibi'})
    self.assertTrue(os.path.exists(os.path.join(workdir, 'extrapolation.png')))

  def test_unknown_preset_is_one_line_and_exit_2(self):
    result = self._script('attention-jax-train', '--config=nope:scale=tiny',
                          f'--workdir={os.path.join(self.away, "never")}')
    self.assertEqual(result.returncode, 2, result.stderr)
    lines = result.stderr.strip().splitlines()
    self.assertLen(lines, 1, result.stderr)
    self.assertIn("'nope'", lines[0])
    self.assertIn('copy, flipflop, seq2seq', lines[0])
    self.assertFalse(os.path.exists(os.path.join(self.away, 'never')))


if __name__ == '__main__':
  absltest.main()
