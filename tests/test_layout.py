"""The library stands alone: it never imports the lab or the lab's tools; and
the package declares every third-party import."""

import ast
import os
import pathlib
import re
import subprocess
import sys

from absl.testing import absltest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = ('attention_jax/attention', 'attention_jax/positional', 'attention_jax/nn',
           'attention_jax/__init__.py')
FORBIDDEN = ('attention_jax.lab', 'ml_collections', 'orbax', 'matplotlib', 'absl', 'tqdm',
             'tensorboardX')


def _library_files():
  for entry in LIBRARY:
    path = os.path.join(ROOT, entry)
    if path.endswith('.py'):
      yield path
      continue
    for folder, _, names in os.walk(path):
      yield from (os.path.join(folder, n) for n in sorted(names) if n.endswith('.py'))


def _imports(path):
  """Every module a file imports, absolute names (relative imports resolved
  against its package)."""
  package = os.path.relpath(os.path.dirname(path), ROOT).replace(os.sep, '.')
  with open(path, encoding='utf-8') as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        parts = package.split('.')
        base = '.'.join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
      yield base
      yield from (f'{base}.{alias.name}' for alias in node.names)


class LayoutTest(absltest.TestCase):

  def _tracked(self):
    if not os.path.isdir(os.path.join(ROOT, '.git')):
      self.skipTest('not a git checkout')
    return set(subprocess.run(['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.split())

  def test_docs_files_lists_every_tracked_file(self):
    """docs/files.md: one line per tracked file (first word the path) in its
    ``` blocks, and nothing git does not track."""
    tracked = self._tracked()
    text = pathlib.Path(ROOT, 'docs', 'files.md').read_text(encoding='utf-8')
    blocks = text.split('```')[1::2]
    listed = [line.split()[0] for block in blocks for line in block.splitlines() if line.strip()]
    self.assertEqual(sorted(p for p in set(listed) if listed.count(p) > 1), [],
                     'docs/files.md lists these twice')
    self.assertEqual(sorted(tracked - set(listed)), [], 'files missing from docs/files.md')
    self.assertEqual(sorted(set(listed) - tracked), [], 'docs/files.md names files not in git')

  def test_readme_tree_names_every_folder(self):
    """The README's folder tree (the first ``` block of "## Architecture"):
    every top-level folder that holds tracked files, and every package folder
    (a tracked __init__.py) below it, one line each; no folder that holds none.
    Test folders are named to the first level below tests/ (tests/lab), whose
    line says that its folders mirror the package's rooms (docs/files.md
    lists every file)."""
    tracked = self._tracked()
    text = pathlib.Path(ROOT, 'README.md').read_text(encoding='utf-8')
    section = text[text.index('\n## Architecture'):]
    block = section.split('```')[1]
    listed = {line.split()[0].rstrip('/') for line in block.splitlines() if line.strip()}
    top = {p.split('/')[0] for p in tracked if '/' in p}
    packages = {os.path.dirname(p) for p in tracked if p.endswith('/__init__.py')
                and not (p.startswith('tests/') and p.count('/') > 2)}
    self.assertEqual(sorted((top | packages) - listed), [], 'folders missing from the README tree')
    folders = {os.path.dirname(p) for p in tracked}
    held = {'/'.join(f.split('/')[:i]) for f in folders for i in range(1, f.count('/') + 2)}
    self.assertEqual(sorted(listed - held), [], 'the README tree names folders without tracked files')

  def test_library_modules_import_nothing_of_the_lab(self):
    files = list(_library_files())
    self.assertGreater(len(files), 20)  # the walk found the library
    offences = []
    for path in files:
      for name in _imports(path):
        if any(name == f or name.startswith(f + '.') for f in FORBIDDEN):
          offences.append(f'{os.path.relpath(path, ROOT)} imports {name}')
    self.assertEqual(offences, [])

  def test_importing_the_package_does_not_import_the_lab(self):
    code = ("import attention_jax, sys; "
            "bad = [m for m in sys.modules if m == 'attention_jax.lab' or "
            "m.startswith('attention_jax.lab.')]; assert not bad, bad")
    result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True,
                            text=True, check=False)
    self.assertEqual(result.returncode, 0, result.stderr)

  def test_public_api_is_declared(self):
    import attention_jax as aj  # pylint: disable=g-import-not-at-top
    for name in ('PositionalEncoding', 'register_encoding', 'make_encoding', 'ENCODINGS',
                 'generate', 'scaled_dot_product_attention', 'MultiHeadAttention',
                 'TransformerLM'):
      self.assertIn(name, aj.__all__)
    self.assertEqual([n for n in aj.__all__ if not hasattr(aj, n)], [])



PATH_ROOT = pathlib.Path(ROOT)
DISTRIBUTIONS = {'orbax': 'orbax-checkpoint', 'absl': 'absl-py', 'yaml': 'pyyaml'}
FIRST_PARTY = {'attention_jax', 'experiments', 'configs', 'tests', 'benchmarks'}


def _canonical(name: str) -> str:
  return re.sub(r'[-_.]+', '-', name).lower()


def _requirements(lines) -> dict[str, str]:
  """{canonical name: version range} of requirement strings."""
  found = [re.match(r'([A-Za-z0-9_.\-]+)\s*(.*)', line.split('#')[0].strip()) for line in lines]
  return {_canonical(m[1]): m[2].replace(' ', '') for m in found if m}


def _distributions_imported(paths) -> set[str]:
  """Third-party distributions imported (at top level of a dotted name) by `paths`."""
  found = set()
  for path in paths:
    for node in ast.walk(ast.parse(path.read_text())):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
      for name in filter(None, names):
        top = name.split('.')[0]
        if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
          found.add(_canonical(DISTRIBUTIONS.get(top, top)))
  return found


class DeclaredDependenciesTest(absltest.TestCase):
  """E. The package says what it needs."""

  def test_every_import_is_declared_with_the_same_ranges_everywhere(self):
    try:
      import tomllib  # pylint: disable=g-import-not-at-top
    except ImportError:  # Python 3.10
      self.skipTest('tomllib needs Python 3.11')
    project = tomllib.loads((PATH_ROOT / 'pyproject.toml').read_text())['project']
    core = _requirements(project['dependencies'])
    lab = _requirements(project['optional-dependencies']['lab'])
    test = _requirements(project['optional-dependencies']['test'])
    library = [p for p in (PATH_ROOT / 'attention_jax').rglob('*.py') if 'lab' not in p.parts]
    lab_code = [*(PATH_ROOT / 'attention_jax' / 'lab').rglob('*.py'),
                *(PATH_ROOT / 'experiments').rglob('*.py'), *(PATH_ROOT / 'configs').rglob('*.py')]
    self.assertContainsSubset(_distributions_imported(library), set(core))
    self.assertContainsSubset(_distributions_imported(lab_code), set(core) | set(lab))
    self.assertEqual(_requirements((PATH_ROOT / 'requirements.txt').read_text().splitlines()),
                     {**core, **lab, **test})

if __name__ == '__main__':
  absltest.main()
