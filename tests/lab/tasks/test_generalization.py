"""Hard-ALiBi, the learned window, position coupling and packed training."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
import pytest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.lab.config import facts
from attention_jax.lab import tasks
from attention_jax.nn.decoding import greedy_predictions
from attention_jax.lab.config.resolved import resolve

NEW = ('hard_alibi', 'learned_window')


def _lm(encoding, **options):
  return aj.TransformerLM(vocab_size=11, d_model=16, num_heads=4, num_layers=2, mlp_dim=32,
                          encoding=encoding, max_positions=64, encoding_options=options,
                          rngs=nnx.Rngs(0))


def _hard_alibi_reference(widths, num_heads, t):
  """The official loop (GPTHardAlibiAttention._attn) in NumPy: masked head i
  opens diagonals j = 0 … i of a matrix of mask values; here any widths."""
  bias = np.zeros((num_heads, t, t), np.float32)
  for h, w in enumerate(widths):
    head = np.full((t, t), aj.MASK_VALUE, np.float32)
    for j in range(w):
      head[np.arange(j, t), np.arange(0, t - j)] = 0.0
    bias[h] = head
  return bias



def _assert_cached_equals_full(model, pos):
  """Prefill 5 tokens, then one token per `extend`: the logits of the full
  causal pass, with the default or explicit positions `pos` `[2, 12]`."""
  tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 11)
  want = model(tokens, positions=pos)
  cache = model.init_cache(2, 12)
  at = lambda a, b: None if pos is None else pos[:, a:b]
  pieces = [model.extend(tokens[:, :5], cache, 0, positions=at(0, 5))]
  cache = pieces[0][1]
  for i in range(5, 12):
    logits, cache = model.extend(tokens[:, i:i + 1], cache, i, positions=at(i, i + 1))
    pieces.append((logits, cache))
  chex.assert_trees_all_close(jnp.concatenate([p[0] for p in pieces], 1), want, atol=2e-5)

class HardALiBiTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters(((1, 2), 4), ((1, 2, 3, 4, 5, 6), 8), ((3, 1), 2), ((), 4))
  def test_bias_matches_the_official_masks(self, widths, num_heads):
    enc = aj.make_encoding('hard_alibi', d_model=8 * num_heads, num_heads=num_heads,
                           widths=widths)
    expected_widths = widths or tuple(range(1, num_heads // 2 + 1))
    got = np.asarray(enc.attention_bias(np.arange(9), np.arange(9)))[0]  # [1, H, T, T]
    self.assertEqual(got.dtype, np.float32)
    self.assertTrue(np.all(np.isfinite(got)))
    np.testing.assert_array_equal(got, _hard_alibi_reference(expected_widths, num_heads, 9))

  def test_batched_positions_use_position_differences(self):
    enc = aj.make_encoding('hard_alibi', d_model=16, num_heads=2, widths=(2,))
    q = np.array([[0, 5, 6], [3, 4, 10]])
    got = np.asarray(enc.attention_bias(q, q))
    chex.assert_shape(got, (2, 2, 3, 3))
    d = q[:, :, None] - q[:, None, :]
    np.testing.assert_array_equal(got[:, 0] == 0, (d >= 0) & (d < 2))
    np.testing.assert_array_equal(got[:, 1], 0.0)

  @parameterized.parameters(
      (dict(widths=(0, 2)), r'widths=\(0, 2\) must be integers >= 1.*got 0'),
      (dict(widths=(1.5,)), r'got 1\.5'),
      (dict(widths=(1, 2, 3, 4, 5)), r'widths=\(1, 2, 3, 4, 5\) gives 5 windowed heads .* num_heads=4'),
      (dict(num_windowed_heads=5), r'num_windowed_heads=5 must be an integer in 0 … num_heads=4'),
      (dict(num_windowed_heads=2, widths=(1,)), r'widths=\(1,\) has 1 entries but num_windowed_heads=2'),
      (dict(num_windowed_heads=-1), r'num_windowed_heads=-1'),
  )
  def test_bad_options_are_clear_errors(self, options, message):
    with self.assertRaisesRegex(ValueError, message):
      aj.make_encoding('hard_alibi', d_model=16, num_heads=4, **options)


class LearnedWindowTest(chex.TestCase):

  def test_formula_and_free_heads(self):
    enc = aj.make_encoding('learned_window', d_model=16, num_heads=4, init_widths=(1, 3),
                           temperature=2.0)
    got = np.asarray(enc.attention_bias(np.arange(6), np.arange(6)))[0]  # [1, H, T, T]
    d = np.arange(6)[:, None] - np.arange(6)[None, :]
    for h, w in enumerate((1, 3)):
      want = -np.logaddexp(0.0, -2.0 * (w - 0.5 - d))  # log σ(τ (w − ½ − d))
      np.testing.assert_allclose(got[h], want, atol=1e-5)
    np.testing.assert_array_equal(got[2:], 0.0)
    np.testing.assert_allclose(enc.widths(), [1.0, 3.0], rtol=1e-5)

  @pytest.mark.slow
  def test_width_and_temperature_are_trained(self):
    model = _lm('learned_window', init_widths=(1, 2))
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 11)
    grads = nnx.grad(lambda m: jnp.sum(jnp.sin(m(tokens))))(model)
    enc = grads.blocks[0].attention.positional
    self.assertTrue(np.all(np.abs(np.asarray(enc.raw_width[...])) > 0))
    self.assertTrue(np.all(np.abs(np.asarray(enc.raw_temperature[...])) > 0))

  def test_bad_options_are_clear_errors(self):
    with self.assertRaisesRegex(ValueError, r'temperature=0\.0 must be a finite number > 0'):
      aj.make_encoding('learned_window', d_model=16, num_heads=4, temperature=0.0)
    with self.assertRaisesRegex(ValueError, r'learned_window: widths=\(-1,\)'):
      aj.make_encoding('learned_window', d_model=16, num_heads=4, init_widths=(-1,))


class CausalityAndCacheTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters(*NEW)
  def test_output_never_depends_on_later_inputs(self, encoding):
    model = _lm(encoding)
    x = jax.random.normal(jax.random.key(2), (1, 10, 16))
    for i in (0, 4, 9):
      g = np.asarray(jax.grad(lambda x_: out_at_x(model, x_, i))(x))
      self.assertTrue(np.all(g[0, i + 1:] == 0), f'{encoding}: output {i} sees later inputs')
      self.assertTrue(np.any(g[0, :i + 1] != 0))

  @parameterized.product(encoding=NEW, positions=('default', 'explicit'))
  def test_cached_decoding_equals_the_full_pass(self, encoding, positions):
    pos = (jnp.array([[0, 3, 4, 9, 20, 21, 22, 30, 31, 40, 50, 63]] * 2)
           if positions == 'explicit' else None)
    _assert_cached_equals_full(_lm(encoding), pos)

  @parameterized.parameters(*NEW)
  @pytest.mark.slow
  def test_greedy_generation_equals_repeated_full_forward(self, encoding):
    model = _lm(encoding)
    prompt = jax.random.randint(jax.random.key(3), (2, 4), 0, 11)
    inputs = jnp.concatenate([prompt, jnp.zeros((2, 6), jnp.int32)], 1)
    got = greedy_predictions(model, inputs, jnp.array([4, 4]))
    seq = prompt
    for _ in range(7):
      seq = jnp.concatenate([seq, jnp.argmax(model(seq)[:, -1], -1)[:, None].astype(jnp.int32)], 1)
    np.testing.assert_array_equal(got[:, 3:], seq[:, 4:11])


def out_at_x(model, x, i):
  """Sum of the last block's output at position i for hidden inputs x `[1, T, D]`."""
  h = x
  for block in model.blocks:
    h, _ = block(h, positions=np.arange(x.shape[1]), return_weights=False)
  return h[0, i].sum()


SOURCE = {  # 1-based input index each output k (1-based) is computed from
    'copy': lambda n, k: k,
    'reverse': lambda n, k: n - k + 1,
    'duplicate': lambda n, k: (k - 1) % n + 1,
}


def _task(name, **kw):
  return dataclasses.replace(tasks.get_task(name), **kw)


class CouplingTest(parameterized.TestCase):

  @parameterized.product(name=sorted(SOURCE), pack=(1, 3))
  def test_coupled_ids_follow_the_rule(self, name, pack):
    task = _task(name, pack=pack, coupled_max_position=30)
    batch = tasks.train_batch(task, 0, jnp.int32(5), batch_size=16, min_length=1,
                              max_length=6, vocab_size=5)
    tokens = np.concatenate([batch['inputs'][:, :1], batch['targets']], 1)
    positions = np.concatenate([batch['positions'], np.zeros((16, 1), np.int32)], 1)
    lengths = np.asarray(batch['lengths']).reshape(16, pack)
    self.assertLess(positions.max(), 30)
    for row in range(16):
      start = 0
      for n in lengths[row]:
        m = task.spec.output_factor * n
        tok, pos = tokens[row, start:], positions[row, start:]
        s = pos[1] - 1  # x_1 sits at s + 1
        self.assertGreaterEqual(s, 1)
        np.testing.assert_array_equal(pos[1:n + 1], s + np.arange(1, n + 1))
        step = -1 if name == 'reverse' else 1  # reading order along x
        for k in range(1, m + 1):
          i = SOURCE[name](n, k)
          self.assertEqual(tok[n + 1 + k], tok[i])  # y_k copies x_i …
          # … and the token that predicts it (SEP, then y_{k-1}) sits one
          # step before x_i's id, at every k, so one offset finds the input.
          self.assertEqual(pos[n + k], s + i - step)
        self.assertEqual(pos[n + 1 + m], s + SOURCE[name](n, m))  # the last y
        self.assertEqual(pos[n + 1], s if name != 'reverse' else s + n + 1)  # SEP
        if name != 'duplicate':  # the official rule: y_k carries x_src(k)'s id
          np.testing.assert_array_equal(
              pos[n + 2:n + 2 + m], [s + SOURCE[name](n, k) for k in range(1, m + 1)])
        self.assertEqual((pos[0], pos[n + 2 + m]), (0, 0))  # BOS, EOS
        start += n * (1 + task.spec.output_factor) + 3

  def test_evaluation_uses_offset_one(self):
    batch = tasks.make_batch(_task('reverse', coupled_max_position=20), jax.random.key(0),
                             jnp.array([3]), vocab_size=5, max_input_length=4)
    np.testing.assert_array_equal(batch['positions'][0], [0, 2, 3, 4, 5, 4, 3, 2, 0, 0])

  def test_duplicate_second_copy_restarts_at_sep(self):
    # y_3 (the last of the first copy) predicts x_1 again: it takes SEP's id.
    batch = tasks.make_batch(_task('duplicate', coupled_max_position=20), jax.random.key(0),
                             jnp.array([3]), vocab_size=5, max_input_length=3)
    np.testing.assert_array_equal(batch['positions'][0], [0, 2, 3, 4, 1, 2, 3, 1, 2, 3, 4])

  def test_config_helpers(self):
    from configs import copy as copy_config
    c = copy_config.get_config('encoding=learned:coupled')
    self.assertTrue(facts.is_coupled(c))
    self.assertEqual(facts.coupled_max_position(c), c.eval.max_length + 3)
    self.assertGreaterEqual(facts.model_max_positions(c), facts.coupled_max_position(c))
    self.assertEqual(facts.configured_task(c).coupled_max_position, 67)
    c.positions.max_position = 40
    with self.assertRaisesRegex(ValueError, 'max_position=40 is below max_input_length'):
      facts.configured_task(c)
    c = copy_config.get_config('encoding=alibi')
    self.assertFalse(facts.is_coupled(c))
    c.task.pack = 0
    with self.assertRaisesRegex(ValueError, r'task.pack=0 must be an integer >= 1'):
      facts.configured_task(c)


class PackingTest(parameterized.TestCase):

  @parameterized.parameters(*sorted(SOURCE))
  def test_every_packed_example_keeps_rule_and_mask(self, name):
    task = _task(name, pack=3)
    batch = tasks.train_batch(task, 1, jnp.int32(0), batch_size=8, min_length=1,
                              max_length=5, vocab_size=5)
    self.assertNotIn('positions', batch)
    t = 3 * tasks.sequence_length(task, 5) - 1
    self.assertEqual(batch['inputs'].shape, (8, t))
    tokens = np.concatenate([batch['inputs'][:, :1], batch['targets']], 1)
    for row in range(8):
      start, want_mask = 0, np.zeros(t + 1, bool)
      for n in np.asarray(batch['lengths'])[row]:
        x = list(tokens[row, start + 1:start + n + 1])
        y = {'copy': x, 'reverse': x[::-1], 'duplicate': x + x}[name]
        self.assertEqual(tokens[row, start], tasks.BOS)
        self.assertEqual(tokens[row, start + n + 1], tasks.SEP)
        self.assertEqual(list(tokens[row, start + n + 2:start + n + 2 + len(y)]), y)
        self.assertEqual(tokens[row, start + n + 2 + len(y)], tasks.EOS)
        want_mask[start + n + 2:start + n + 3 + len(y)] = True
        start += n + len(y) + 3
      np.testing.assert_array_equal(tokens[row, start:], tasks.PAD)
      np.testing.assert_array_equal(np.asarray(batch['loss_mask'][row]), want_mask[1:])

  def test_pack_one_leaves_the_stream_unchanged(self):
    plain = tasks.get_task('copy')
    a = tasks.train_batch(plain, 2, jnp.int32(3), batch_size=4, min_length=1, max_length=4,
                          vocab_size=5)
    b = tasks.train_batch(_task('copy', pack=1), 2, jnp.int32(3), batch_size=4, min_length=1,
                          max_length=4, vocab_size=5)
    chex.assert_trees_all_equal(a, b)

  def test_concatenate(self):
    arrays = jnp.array([[[1, 2, 0]], [[3, 0, 0]], [[4, 5, 6]]])
    got = tasks.packing.concatenate(arrays, jnp.array([[2], [1], [3]]), -1)
    np.testing.assert_array_equal(got, [[1, 2, 3, 4, 5, 6, -1, -1, -1]])



def _windowed_rope_reference(windows, num_heads, q_pos, k_pos, sink):
  """The bias by loops, positions `[T]`: windowed head h opens keys with
  |p_i − p_j| <= w_h (and id 0 with `sink`), other heads are open."""
  bias = np.zeros((num_heads, len(q_pos), len(k_pos)), np.float32)
  for h, w in enumerate(windows):
    for i, p in enumerate(q_pos):
      for j, r in enumerate(k_pos):
        if not (abs(p - r) <= w or (sink and r == 0)):
          bias[h, i, j] = aj.MASK_VALUE
  return bias


WINDOWED = (dict(window=2), dict(window=1, sink=True), dict(windows=(1, 3), sink=True))
COUPLED_POSITIONS = [0, 2, 3, 4, 1, 2, 3, 4, 0, 0, 0, 0]  # BOS x1 x2 x3 SEP y1 y2 y3 EOS PAD…


class WindowedRoPETest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters(((2,) * 4, 4, False), ((1, 3), 4, True), ((0,), 2, False),
                            ((1,) * 8, 8, True))
  def test_bias_matches_the_reference(self, windows, num_heads, sink):
    enc = aj.make_encoding('windowed_rope', d_model=8 * num_heads, num_heads=num_heads,
                           windows=windows, sink=sink)
    pos = np.array(COUPLED_POSITIONS[:9] + [7, 12, 30])
    got = np.asarray(enc.attention_bias(pos, pos))[0]  # [1, H, T, T]
    self.assertEqual(got.dtype, np.float32)
    self.assertTrue(np.all(np.isfinite(got)))
    np.testing.assert_array_equal(got, _windowed_rope_reference(windows, num_heads, pos, pos,
                                                                sink))
    batched = np.asarray(enc.attention_bias(np.stack([pos, pos + 5]), np.stack([pos, pos + 5])))
    chex.assert_shape(batched, (2, num_heads, 12, 12))
    np.testing.assert_array_equal(batched[1], _windowed_rope_reference(
        windows, num_heads, pos + 5, pos + 5, sink))

  def test_defaults_and_rotation(self):
    enc = aj.make_encoding('windowed_rope', d_model=32, num_heads=4)
    self.assertEqual(enc.windows, (2, 2, 2, 2))  # window 2 in every head
    self.assertFalse(enc.sink)
    self.assertEqual(aj.make_encoding('windowed_rope', d_model=32, num_heads=4,
                                      num_windowed_heads=-1, windows=(1,)).windows, (1,))
    self.assertIsNone(aj.make_encoding('windowed_rope', d_model=32, num_heads=4,
                                       num_windowed_heads=0).attention_bias(np.arange(3),
                                                                            np.arange(3)))
    q = jax.random.normal(jax.random.key(0), (1, 5, 4, 8))
    k = jax.random.normal(jax.random.key(1), (1, 5, 4, 8))
    rope = aj.make_encoding('rope', d_model=32, num_heads=4)
    chex.assert_trees_all_close(enc.rotate_queries_keys(q, k, np.arange(5), np.arange(5)),
                                rope.rotate_queries_keys(q, k, np.arange(5), np.arange(5)))

  @parameterized.parameters(
      (dict(window=-1), r'^windowed_rope: window=-1 must be an integer >= 0'),
      (dict(windows=(2, -1)), r'^windowed_rope: windows=\(2, -1\) must be integers >= 0 .*got -1'),
      (dict(windows=(1.5,)), r'got 1\.5'),
      (dict(num_windowed_heads=5), r'num_windowed_heads=5 must be an integer in 0 … num_heads=4'),
      (dict(num_windowed_heads=2, windows=(1,)), r'windows=\(1,\) has 1 entries but num_windowed_heads=2'),
      (dict(width=3), r'unknown option'),
  )
  def test_bad_options_are_clear_errors(self, options, message):
    with self.assertRaisesRegex(ValueError, message):
      aj.make_encoding('windowed_rope', d_model=16, num_heads=4, **options)

  @parameterized.parameters(*WINDOWED)
  def test_output_never_depends_on_later_inputs(self, **options):
    model = _lm('windowed_rope', **options)
    x = jax.random.normal(jax.random.key(2), (1, 10, 16))
    for i in (0, 4, 9):
      g = np.asarray(jax.grad(lambda x_: out_at_x(model, x_, i))(x))
      self.assertTrue(np.all(g[0, i + 1:] == 0), f'{options}: output {i} sees later inputs')
      self.assertTrue(np.any(g[0, :i + 1] != 0))

  @parameterized.parameters(False, True)
  @pytest.mark.slow
  def test_one_layer_sees_exactly_its_window(self, sink):
    """Gradients of one all-windowed layer: the token at position id p reads
    an earlier token iff its id is within the window (ahead or behind) or 0
    with `sink`, never by token distance."""
    model = aj.TransformerLM(vocab_size=11, d_model=16, num_heads=4, num_layers=1, mlp_dim=32,
                             encoding='windowed_rope', max_positions=64,
                             encoding_options=dict(window=1, sink=sink), rngs=nnx.Rngs(0))
    pos = np.array(COUPLED_POSITIONS[:9])
    x = jax.random.normal(jax.random.key(4), (1, 9, 16))
    def out(x_, i):
      h, _ = model.blocks[0](x_, positions=pos, return_weights=False)
      return h[0, i].sum()
    for i in range(9):
      g = np.abs(np.asarray(jax.grad(out)(x, i))[0]).sum(-1)
      want = np.array([j <= i and (abs(pos[i] - pos[j]) <= 1 or (sink and pos[j] == 0))
                       for j in range(9)])
      np.testing.assert_array_equal(g > 0, want, err_msg=f'query {i} (id {pos[i]})')

  @parameterized.product(options=WINDOWED, positions=('default', 'coupled'))
  def test_cached_decoding_equals_the_full_pass(self, options, positions):
    pos = (jnp.array([COUPLED_POSITIONS, [0, 6, 7, 8, 5, 6, 7, 8, 0, 9, 10, 11]])
           if positions == 'coupled' else None)
    _assert_cached_equals_full(_lm('windowed_rope', **options), pos)

  @parameterized.parameters(*WINDOWED)
  @pytest.mark.slow
  def test_greedy_generation_equals_repeated_full_forward(self, **options):
    model = _lm('windowed_rope', **options)
    prompt = jax.random.randint(jax.random.key(3), (2, 4), 0, 11)
    inputs = jnp.concatenate([prompt, jnp.zeros((2, 6), jnp.int32)], 1)
    got = greedy_predictions(model, inputs, jnp.array([4, 4]))
    seq = prompt
    for _ in range(7):
      seq = jnp.concatenate([seq, jnp.argmax(model(seq)[:, -1], -1)[:, None].astype(jnp.int32)], 1)
    np.testing.assert_array_equal(got[:, 3:], seq[:, 4:11])

  def test_generalize_preset(self):
    from configs import copy as copy_config
    c = copy_config.get_config('study=generalize')
    self.assertEqual(c.model.encoding, 'windowed_rope:coupled')
    self.assertTrue(facts.is_coupled(c))
    self.assertEqual(facts.encoding_options(c), dict(windows=(), window=2, base=10000.0,
                                                      num_windowed_heads=-1, sink=True))
    model = resolve(c).build_model(0)
    enc = model.blocks[0].attention.positional
    self.assertEqual((enc.windows, enc.sink), ((2,) * c.model.num_heads, True))


if __name__ == '__main__':
  absltest.main()
