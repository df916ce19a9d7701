"""A misspelt encoding name, modifier or option is refused with the closest
valid one ("Did you mean"), wherever the name is read: `make_encoding`,
`parse_encoding_spec` and the modules' `encoding=` / `encoding_options=`."""

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj


class EncodingSuggestionsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('_typo', 'ropee', "Did you mean 'rope'?"),
      ('_case', 'Rope', "Did you mean 'rope'?"),
      ('_close', 'alibe', "Did you mean 'alibi'?"),
      ('_modifier', 'rope:randomised', "Did you mean 'randomized'?"),
      ('_both', 'rpoe:randomized', "Did you mean 'rope'?"))
  def test_names(self, name, hint):
    with self.assertRaisesRegex(ValueError, hint):
      aj.make_encoding(name, d_model=8, num_heads=2)
    with self.assertRaisesRegex(ValueError, hint):
      aj.parse_encoding_spec(name)
    with self.assertRaisesRegex(ValueError, hint):
      aj.MultiHeadAttention(8, 2, causal=True, encoding=name, rngs=nnx.Rngs(0))

  def test_nothing_close_gives_no_suggestion(self):
    with self.assertRaises(ValueError) as refused:
      aj.make_encoding('zzzzzz', d_model=8, num_heads=2)
    self.assertNotIn('Did you mean', str(refused.exception))
    self.assertIn("'rope'", str(refused.exception))  # the choices are listed

  @parameterized.named_parameters(
      ('_rope', 'rope', {'bse': 500.0}, "'bse' is not one of its options \\['base'\\]. "
       "Did you mean 'base'\\?"),
      ('_alibi', 'alibi', {'bse': 500.0}, r"got an unknown option among \['bse'\]"))
  def test_options(self, name, options, message):
    with self.assertRaisesRegex(ValueError, message):
      aj.make_encoding(name, d_model=8, num_heads=2, **options)
    with self.assertRaisesRegex(ValueError, message + '|encoding_options'):
      aj.MultiHeadAttention(8, 2, causal=True, encoding=name, encoding_options=options,
                            rngs=nnx.Rngs(0))

  def test_a_valid_option_is_served(self):
    rope = aj.make_encoding('rope', d_model=8, num_heads=2, base=500.0)
    self.assertEqual(rope.base, 500.0)


if __name__ == '__main__':
  absltest.main()
