"""Positional encodings against their formulas, and the registry."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

from attention_jax import positional as pe
from attention_jax.positional.sinusoidal import sinusoidal_frequencies
from tests import references as ref


class AnglesTest(parameterized.TestCase):

  @parameterized.parameters(0, 1, 9_999, 10_000, 123_457, 2**24 + 1, 2**31 - 1, -70_001)
  def test_reduced_angle_is_exact_to_float32(self, position):
    freqs = pe.rope_frequencies(64) * np.float64(1.7)  # arbitrary, non-round
    got = np.asarray(pe.rotation_angles(jnp.array([position]), freqs))[0]
    exact = np.mod(position * freqs.astype(np.longdouble) + np.pi, 2 * np.pi) - np.pi
    err = np.abs(np.angle(np.exp(1j * (got - exact.astype(np.float64)))))
    self.assertLess(err.max(), 5e-7)
    self.assertTrue(np.all((got >= -np.pi) & (got <= np.pi)))

  def test_rejects_float_positions(self):
    with self.assertRaisesRegex(TypeError, 'integer array, got dtype float32'):
      pe.rotation_angles(jnp.arange(3.0), pe.rope_frequencies(4))


class SinusoidalTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters((16, 32), (5, 7), (3, 1))
  def test_lesson_formula(self, length, dim):
    got = self.variant(lambda: pe.sinusoidal(length, dim))()
    chex.assert_shape(got, (length, dim))
    self.assertEqual(got.dtype, jnp.float32)
    np.testing.assert_allclose(got, ref.sinusoidal(range(length), dim), atol=1e-6)

  def test_far_positions_are_as_exact_as_near_ones(self):
    positions = np.array([10_000, 65_535, 100_003, 1_000_000])
    got = pe.sinusoidal_at(positions, 64)
    np.testing.assert_allclose(got, ref.sinusoidal(positions, 64), atol=1e-6)

  def test_matches_the_lesson_torch_layout(self):
    # The lesson's code: even dims sin(pos * div), odd dims cos(pos * div).
    got = np.asarray(pe.sinusoidal(4, 6))
    div = np.exp(np.arange(0, 6, 2) * (-np.log(10000.0) / 6))
    np.testing.assert_allclose(got[:, 0::2], np.sin(np.arange(4)[:, None] * div), atol=1e-6)
    np.testing.assert_allclose(got[:, 1::2], np.cos(np.arange(4)[:, None] * div), atol=1e-6)


class LearnedTest(parameterized.TestCase):

  def _encoding(self, max_length=8):
    return pe.make_encoding('learned', d_model=4, num_heads=1, max_positions=max_length,
                            rngs=nnx.Rngs(0))

  def test_adds_table_rows(self):
    enc = self._encoding()
    x = jnp.zeros((2, 5, 4))
    out = enc.add_to_embeddings(x, np.arange(5))
    np.testing.assert_array_equal(out[1], enc.table[...][:5])

  def test_too_long_is_a_trace_time_error(self):
    enc = self._encoding()
    f = nnx.jit(lambda enc, x: enc.add_to_embeddings(x, np.arange(x.shape[1])))
    with self.assertRaisesRegex(ValueError, r'\[0, 8\].*max_positions=8'):
      f(enc, jnp.zeros((1, 9, 4)))

  def test_traced_positions_past_the_table_fail_at_run_time(self):
    enc = self._encoding()
    f = nnx.jit(lambda enc, p: enc.add_to_embeddings(jnp.zeros((1, 3, 4)), p))
    f(enc, jnp.array([5, 6, 7])).block_until_ready()  # in range: fine
    with self.assertRaisesRegex(Exception, r'\[6, 8\].*max_positions=8'):
      f(enc, jnp.array([6, 7, 8])).block_until_ready()
    with self.assertRaisesRegex(Exception, r'\[-1, 1\]'):
      f(enc, jnp.array([-1, 0, 1])).block_until_ready()

  def test_needs_a_length(self):
    with self.assertRaisesRegex(ValueError, "'learned' encoding needs max_positions"):
      self._encoding(max_length=None)
    import attention_jax as aj  # pylint: disable=g-import-not-at-top
    kw = dict(vocab_size=5, d_model=8, num_heads=2, num_layers=1, mlp_dim=8, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r"'learned' encoding needs max_positions >= 1 "
                                r'\(the rows of its table, e.g. TransformerLM\(max_positions'):
      aj.TransformerLM(encoding='learned', **kw)
    aj.TransformerLM(encoding='sinusoidal', **kw)  # no table, no length needed


class RopeTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(dtype=(jnp.float32, jnp.bfloat16, jnp.float16), base=(10000.0, 500.0))
  def test_matches_reference(self, dtype, base):
    x = jax.random.normal(jax.random.key(0), (2, 6, 3, 8)).astype(dtype)
    positions = np.array([[0, 1, 2, 3, 4, 5], [7, 100, 10_000, 20_001, 3, 3]])
    got = self.variant(lambda x: pe.apply_rope(x, positions, base))(x)
    self.assertEqual(got.dtype, dtype)
    x32 = np.asarray(x.astype(jnp.float32))
    want = np.stack([ref.rope(x32[b], positions[b], base) for b in range(2)])
    atol = {jnp.float32: 2e-6, jnp.bfloat16: 2e-2, jnp.float16: 4e-3}[dtype]
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=atol)

  @parameterized.parameters((3, 0), (10_000, 9_990), (123_456, 123_000), (5, 60_000))
  def test_scores_depend_only_on_relative_position(self, m, n):
    q, k = jax.random.normal(jax.random.key(1), (2, 1, 1, 64))
    q, k = q / jnp.linalg.norm(q), k / jnp.linalg.norm(k)
    score = lambda a, b: jnp.sum(pe.apply_rope(q, np.array([a])) * pe.apply_rope(k, np.array([b])))
    np.testing.assert_allclose(score(m, n), score(m - n, 0), atol=1e-6)
    np.testing.assert_allclose(score(m + 40_000, n + 40_000), score(m, n), atol=1e-6)

  def test_preserves_norm_and_leaves_position_zero(self):
    x = jax.random.normal(jax.random.key(2), (5, 2, 16))
    rotated = pe.apply_rope(x, np.arange(5) * 977)
    np.testing.assert_allclose(jnp.linalg.norm(rotated, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(rotated[0], x[0], atol=1e-7)

  def test_bad_input(self):
    with self.assertRaisesRegex(ValueError, 'even head_dim'):
      pe.apply_rope(jnp.zeros((1, 4, 1, 5)), np.arange(4))
    with self.assertRaisesRegex(ValueError, 'positions \\(3,\\) must end in the length axis'):
      pe.apply_rope(jnp.zeros((1, 4, 1, 4)), np.arange(3))


class AlibiTest(chex.TestCase, parameterized.TestCase):

  def test_twelve_heads(self):
    want = [2.0**-k for k in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    np.testing.assert_allclose(pe.alibi_slopes(12), want, rtol=1e-7)

  @parameterized.parameters(*range(1, 33), 48, 64, 80)
  def test_slopes_match_reference_rule(self, n):
    np.testing.assert_allclose(pe.alibi_slopes(n), ref.alibi_slopes(n), rtol=1e-7)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(True, False)
  def test_bias(self, causal):
    h, tq, tk = 3, 4, 6
    got = self.variant(lambda: pe.alibi_bias(h, tq, tk, causal=causal))()
    chex.assert_shape(got, (h, tq, tk))
    slopes = ref.alibi_slopes(h)
    for hi, i, j in np.ndindex(h, tq, tk):
      dist = (i - j) if causal else abs(i - j)
      self.assertAlmostEqual(float(got[hi, i, j]), -slopes[hi] * dist, places=6)

  def test_per_example_positions(self):
    positions = np.array([[0, 1, 2], [10, 11, 12]])
    got = pe.alibi_bias_at(pe.alibi_slopes(2), positions, positions)
    chex.assert_shape(got, (2, 2, 3, 3))
    np.testing.assert_array_equal(got[0], got[1])  # only differences matter


class _HeadOffsets(pe.PositionalEncoding):
  """A user encoding: a constant bias per head (for the registry tests)."""

  def __init__(self, num_heads, scale=1.0):
    self.offsets = tuple(scale * h for h in range(num_heads))

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs, scale=1.0):
    del d_model, max_positions, causal, rngs
    return cls(num_heads, scale)

  def score_contribution(self, context):
    shape = (len(self.offsets), len(context.q_positions), len(context.k_positions))
    return pe.dense_spec(jnp.broadcast_to(jnp.asarray(self.offsets)[:, None, None], shape),
                         'a constant bias per head')


class RegistryTest(parameterized.TestCase):

  @parameterized.named_parameters((name, name) for name in sorted(pe.ENCODINGS))
  def test_every_encoding_builds(self, name):
    enc = pe.make_encoding(name, d_model=8, num_heads=2, max_positions=16, rngs=nnx.Rngs(0))
    self.assertIsInstance(enc, pe.PositionalEncoding)

  def test_unknown_name(self):
    with self.assertRaisesRegex(ValueError, r"unknown positional encoding 'rotary'.*'alibi'"):
      pe.make_encoding('rotary', d_model=8, num_heads=2)

  def test_unknown_option(self):
    with self.assertRaisesRegex(ValueError, r"'alibi' got an unknown option among \['base'\]"):
      pe.make_encoding('alibi', d_model=8, num_heads=2, base=3.0)

  def test_register_encoding(self):
    name = 'head_offsets_test'
    pe.register_encoding(name, _HeadOffsets)
    self.addCleanup(pe.ENCODINGS.pop, name)
    enc = pe.make_encoding(name, d_model=8, num_heads=2, scale=3.0)
    self.assertEqual(enc.offsets, (0.0, 3.0))
    self.assertEqual(pe.parse_encoding_spec(name), (name, False))
    self.assertEqual(pe.parse_encoding_spec(f'{name}:randomized'), (name, True))
    import attention_jax as aj  # pylint: disable=g-import-not-at-top
    model = aj.TransformerLM(vocab_size=5, d_model=8, num_heads=2, num_layers=1, mlp_dim=8,
                             encoding=name, rngs=nnx.Rngs(0))
    chex.assert_shape(model(jnp.zeros((1, 4), jnp.int32)), (1, 4, 5))
    pe.register_encoding(name, _HeadOffsets)  # the same class again: fine
    with self.assertRaisesRegex(ValueError, r"'alibi' is already registered \(ALiBi\); pass "
                                'overwrite=True'):
      pe.register_encoding('alibi', _HeadOffsets)
    pe.register_encoding(name, pe.NoPE, overwrite=True)
    self.assertIs(pe.ENCODINGS[name], pe.NoPE)
    with self.assertRaisesRegex(ValueError, 'without ":"'):
      pe.register_encoding('a:b', _HeadOffsets)
    with self.assertRaisesRegex(TypeError, 'not a PositionalEncoding subclass'):
      pe.register_encoding('x', dict)

  @parameterized.named_parameters(
      ('rope_base_negative', 'rope', dict(base=-1.0),
       r'^rope: base=-1.0 must be a finite number > 1 \(θ_i = base\^\(-2i/D\) must fall'),
      ('rope_base_zero', 'rope', dict(base=0.0), r'^rope: base=0.0 must be a finite number > 1'),
      ('rope_base_text', 'rope', dict(base='abc'), r"^rope: base='abc' must be a finite number"),
      ('rope_base_inf', 'rope', dict(base=float('inf')), r'^rope: base=inf must be a finite'),
      ('sinusoidal_base', 'sinusoidal', dict(base=1.0), r'^sinusoidal: base=1.0 must be a finite'),
      ('windowed_rope_base', 'windowed_rope', dict(base=-5.0), r'^windowed_rope: base=-5.0'),
      ('windowed_rope_sink', 'windowed_rope', dict(sink=1), r'^windowed_rope: sink=1 must be '
       'True or False'),
      ('t5_buckets', 't5', dict(num_buckets=1.5), r'^t5: num_buckets=1.5 must be an integer >= 2'),
      ('t5_distance', 't5', dict(max_distance=0), r'^t5: max_distance=0 must be an integer >= 1'),
      ('learned_stddev', 'learned', dict(stddev=float('nan')), r'^learned: stddev=nan must be'),
      ('learned_check', 'learned', dict(check_positions='no'), r"^learned: check_positions='no'"),
      ('fire_eps', 'fire', dict(eps=0), r'^fire: eps=0 must be a finite number > 0\.$'),
      ('fox_bias', 'fox', dict(bias_init=True), r'^fox: bias_init=True must be a finite number\.$'),
  )
  def test_bad_option_value_names_the_option(self, name, options, message):
    with self.assertRaisesRegex(ValueError, message):
      pe.make_encoding(name, d_model=16, num_heads=2, max_positions=8, rngs=nnx.Rngs(0),
                       **options)

  def test_pure_frequencies_refuse_a_bad_base(self):
    for function in (pe.rope_frequencies, sinusoidal_frequencies):
      with self.assertRaisesRegex(ValueError, r'base=-1.0 must be a finite number > 1'):
        function(16, base=-1.0)
    self.assertTrue(np.all(np.isfinite(pe.rope_frequencies(16, base=2))))  # ints are numbers

  def test_position_limits_are_asked_before_tracing(self):
    xpos = pe.make_encoding('xpos', d_model=16, num_heads=2)
    limit = xpos.position_limit()
    xpos.check_position_range(0, limit)  # the last representable position is fine
    with self.assertRaisesRegex(ValueError, rf'xpos: query and key positions range over '
                                rf'\[0, {limit + 1}\] .*\(\|position - centre\| <= {limit}\)'):
      xpos.check_position_range(0, limit + 1)
    table = pe.make_encoding('learned', d_model=16, num_heads=2, max_positions=8,
                             rngs=nnx.Rngs(0))
    table.check_position_range(0, 7)
    with self.assertRaisesRegex(ValueError, r'range over \[0, 8\] but the learned table has '
                                'max_positions=8'):
      table.check_position_range(0, 8)
    pe.make_encoding('rope', d_model=16, num_heads=2).check_position_range(0, 2**30)  # no limit

  def test_heads_must_divide_width(self):
    with self.assertRaisesRegex(ValueError, 'num_heads=3 does not divide d_model=8'):
      pe.make_encoding('rope', d_model=8, num_heads=3)


if __name__ == '__main__':
  absltest.main()
