"""The library stands alone: it never imports the lab or the lab's tools."""

import ast
import os
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


if __name__ == '__main__':
  absltest.main()
