"""Sampling (`nn.sampling`) and `generate`'s sampling, EOS and ragged prompts."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.nn.sampling import process_logits
from attention_jax.nn.sampling import sample_tokens
from tests import tiers

V = 11
STARTS = []  # the `start` of each FixedLogits.extend call that ran


def _lm(encoding='rope', **kw):
  return aj.TransformerLM(vocab_size=V, d_model=16, num_heads=4, num_layers=1, mlp_dim=32,
                          encoding=encoding, max_positions=64, rngs=nnx.Rngs(0), **kw)


class FixedLogits(nnx.Module):
  """The cache protocol with logits that ignore the tokens; records in
  STARTS the `start` of each `extend` call that runs."""

  def __init__(self, logits):
    self.logits = nnx.Variable(jnp.asarray(logits, jnp.float32))

  def init_cache(self, batch_size, cache_size):
    return [dict(unused=jnp.zeros((batch_size, cache_size)))]

  def extend(self, tokens, cache, start):
    jax.debug.callback(lambda s: STARTS.append(int(s)), start)
    b, s = tokens.shape
    return jnp.broadcast_to(self.logits[...], (b, s, self.logits.shape[-1])), cache


def _reference_kept(logits, temperature, top_k, top_p):
  """NumPy: Hugging Face's warpers in order (temperature, top-k, top-p) on
  float64, ties broken toward the lower id; bool `[V]`."""
  scaled = np.asarray(logits, np.float64) / temperature
  order = np.argsort(-scaled, kind='stable')
  kept = np.zeros(scaled.shape, bool)
  k = len(scaled) if top_k is None else top_k
  chosen = order[:k]
  if top_p is not None:
    probs = np.exp(scaled[chosen] - scaled[chosen].max())
    probs /= probs.sum()
    before = np.cumsum(probs) - probs
    chosen = chosen[(before < top_p) | (np.arange(k) == 0) | (top_p >= 1)]
  kept[chosen] = True
  return kept


def _rerun(model, prompt, lengths, num_tokens, *, keys=None, eos_id=None, pad_id=0,
           **options):
  """Uncached generation, row by row: the full forward of the row's
  growing sequence for each token, drawn as `generate` documents (key for
  slot s: fold_in(row key, s - 1))."""
  b, p = prompt.shape
  total = p + num_tokens
  full = jax.jit(lambda tokens: model(tokens))
  out = np.full((b, total), pad_id, np.int32)
  for r in range(b):
    n = int(lengths[r])
    seq = np.zeros((1, total), np.int32)
    seq[0, :n] = prompt[r, :n]
    out[r, :n] = prompt[r, :n]
    for s in range(n, n + num_tokens):
      logits = full(jnp.asarray(seq))[0, s - 1]
      if keys is None:
        token = int(jnp.argmax(logits))
      else:
        token = int(sample_tokens(jax.random.fold_in(keys[r], s - 1), logits, **options))
      seq[0, s] = out[r, s] = token
      if token == eos_id:
        break
  return out


class ProcessLogitsTest(chex.TestCase, parameterized.TestCase):

  @parameterized.product(temperature=(0.5, 1.0, 3.0), top_k=(None, 1, 4, V),
                         top_p=(None, 0.05, 0.5, 0.9, 1.0))
  @tiers.fast_cases(20)  # the first temperature with every top-k and top-p
  def test_kept_tokens_match_the_reference_warpers(self, temperature, top_k, top_p):
    logits = jax.random.normal(jax.random.key(7), (6, V)) * 2
    got = process_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    want = np.stack([_reference_kept(row, temperature, top_k, top_p) for row in logits])
    np.testing.assert_array_equal(np.asarray(got) > aj.MASK_VALUE / 2, want)
    # Kept tokens hold (logits - max) / temperature.
    shifted = (logits - logits.max(-1, keepdims=True)) / temperature
    chex.assert_trees_all_close(jnp.where(want, got, 0), jnp.where(want, shifted, 0),
                                rtol=1e-6)

  def test_temperature_comes_before_top_p(self):
    # Probabilities at T=1: .665 .245 .090; at T=8: .376 .332 .293. top_p=0.8
    # keeps two at T=1 (.665 + .245 reach it) but three at T=8 (.376 + .332
    # do not): the nucleus is that of the scaled logits.
    logits = jnp.array([1.0, 0.0, -1.0])
    kept = lambda t: np.asarray(process_logits(logits, temperature=t, top_p=0.8)) > -1e30
    np.testing.assert_array_equal(kept(1.0), [True, True, False])
    np.testing.assert_array_equal(kept(8.0), [True, True, True])

  def test_top_p_keeps_the_smallest_set_reaching_p(self):
    logits = jnp.log(jnp.array([0.05, 0.5, 0.15, 0.3]))
    kept = lambda p: np.asarray(process_logits(logits, top_p=p)) > -1e30
    np.testing.assert_array_equal(kept(0.49), [False, True, False, False])
    np.testing.assert_array_equal(kept(0.51), [False, True, False, True])
    np.testing.assert_array_equal(kept(0.79), [False, True, False, True])
    np.testing.assert_array_equal(kept(0.81), [False, True, True, True])
    np.testing.assert_array_equal(kept(1e-9), [False, True, False, False])  # at least one
    np.testing.assert_array_equal(kept(1.0), [True, True, True, True])

  @parameterized.named_parameters(
      ('bfloat16', jnp.bfloat16, 1.0, 1.0), ('tiny_temperature', jnp.float32, 1e-30, 1.0),
      ('huge_temperature', jnp.float32, 1e30, 1.0), ('huge_logits', jnp.float32, 1.0, 1e30),
      ('float16_small_temperature', jnp.float16, 1e-3, 100.0))
  def test_no_nan_from_legal_input(self, dtype, temperature, scale):
    logits = (jax.random.normal(jax.random.key(0), (4, V)) * scale).astype(dtype)
    logits = logits.at[0].set(logits[0, 0])  # a row of ties
    for top_k, top_p in ((None, None), (3, 0.9), (None, 1e-6)):
      got = process_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
      self.assertEqual(got.dtype, jnp.float32)
      self.assertTrue(np.isfinite(np.asarray(got)).all())
      chex.assert_trees_all_close(jax.nn.softmax(got).sum(-1), jnp.ones(4), atol=1e-6)
      tokens = sample_tokens(jax.random.key(1), logits, temperature=temperature, top_k=top_k,
                             top_p=top_p)
      self.assertTrue(((tokens >= 0) & (tokens < V)).all())

  @parameterized.named_parameters(('top_k_1', dict(top_k=1)), ('tiny_top_p', dict(top_p=1e-6)),
                                  ('zero_temperature', dict(temperature=0.0)),
                                  ('all_three', dict(temperature=0.0, top_k=5, top_p=0.5)))
  def test_greedy_limits_equal_the_argmax(self, options):
    logits = jax.random.normal(jax.random.key(3), (64, V))
    logits = logits.at[0, 3].set(logits[0].max())  # a tie: the lower id, as argmax
    draws = jax.vmap(lambda k: sample_tokens(k, logits, **options))(
        jax.random.split(jax.random.key(4), 20))
    np.testing.assert_array_equal(draws, np.broadcast_to(jnp.argmax(logits, -1), draws.shape))

  @parameterized.named_parameters(('cold', 0.5, None, None), ('hot', 2.0, None, None),
                                  ('top_k', 1.0, 3, None), ('top_p', 0.7, None, 0.8),
                                  ('top_k_top_p', 1.5, 4, 0.6))
  def test_sampled_frequencies_follow_the_processed_softmax(self, temperature, top_k, top_p):
    logits = jnp.array([2.0, 1.0, 0.5, 0.0, -1.0, 1.5])
    n = 40_000
    draws = sample_tokens(jax.random.key(5), jnp.broadcast_to(logits, (n, 6)),
                          temperature=temperature, top_k=top_k, top_p=top_p)
    freq = np.bincount(np.asarray(draws), minlength=6) / n
    kept = _reference_kept(logits, temperature, top_k, top_p)
    want = np.where(kept, np.exp(np.asarray(logits) / temperature), 0)
    want /= want.sum()
    # 5 standard errors of a frequency; a wrong temperature (T = 1, or
    # multiplying by T) or a wrong set is off by 0.05 or more here.
    bound = 5 * np.sqrt(want * (1 - want) / n) + 1e-9
    self.assertTrue((np.abs(freq - want) <= bound).all(), (freq, want))

  def test_lower_temperature_is_sharper(self):
    logits = jnp.broadcast_to(jnp.array([1.0, 0.5, 0.0, -0.5]), (20_000, 4))
    top = [np.mean(np.asarray(sample_tokens(jax.random.key(6), logits, temperature=t)) == 0)
           for t in (4.0, 1.0, 0.25)]
    self.assertLess(top[0] + 0.02, top[1])
    self.assertLess(top[1] + 0.02, top[2])

  def test_invalid_traced_options_give_nan_and_minus_one(self):
    logits = jnp.zeros((2, V))
    for t, p in ((-1.0, 0.5), (jnp.nan, 0.5), (1.0, 0.0), (1.0, 1.5)):
      got = jax.jit(lambda t, p: process_logits(logits, temperature=t, top_p=p))(t, p)
      self.assertTrue(np.isnan(np.asarray(got)).all())
      tokens = jax.jit(lambda t, p: sample_tokens(jax.random.key(0), logits, temperature=t,
                                                  top_p=p))(t, p)
      np.testing.assert_array_equal(tokens, [-1, -1])

  @parameterized.named_parameters(
      ('negative_temperature', dict(temperature=-0.5), ValueError, r'temperature=-0.5 .*>= 0'),
      ('nan_temperature', dict(temperature=float('nan')), ValueError, r'temperature=nan'),
      ('inf_temperature', dict(temperature=float('inf')), ValueError, r'temperature=inf'),
      ('top_k_0', dict(top_k=0), ValueError, r'top_k=0 .*1 … 11'),
      ('top_k_past_vocab', dict(top_k=12), ValueError, r'top_k=12 .*1 … 11'),
      ('float_top_k', dict(top_k=2.0), TypeError, r'top_k=2.0 must be a Python int'),
      ('top_p_0', dict(top_p=0.0), ValueError, r'top_p=0.0 .*\(0, 1\]'),
      ('top_p_past_1', dict(top_p=1.5), ValueError, r'top_p=1.5 .*\(0, 1\]'),
      ('vector_temperature', dict(temperature=jnp.ones(2)), ValueError,
       r'temperature must be a scalar'))
  def test_bad_options_are_refused(self, options, error, message):
    with self.assertRaisesRegex(error, message):
      process_logits(jnp.zeros((2, V)), **options)
    with self.assertRaisesRegex(error, message):
      sample_tokens(jax.random.key(0), jnp.zeros((2, V)), **options)


class GenerateTest(chex.TestCase, parameterized.TestCase):

  PROMPT = np.array([[1, 2, 3, 4, 5], [6, 7, 0, 0, 0], [8, 9, 10, 1, 0]], np.int32)
  LENGTHS = np.array([5, 2, 4], np.int32)

  def _cached_equals_the_uncached_rerun(self, seed, options):
    model = _lm()
    keys = None if seed is None else jax.random.split(jax.random.key(seed), 3)
    # Under jit, the key, prompt lengths and options traced.
    run = jax.jit(lambda prompt, lengths, keys, options: aj.generate(
        model, prompt, 6, prompt_lengths=lengths, key=keys, top_k=4 if options else None,
        **options))
    got = run(self.PROMPT, self.LENGTHS, keys, options)
    want = _rerun(model, self.PROMPT, self.LENGTHS, 6, keys=keys,
                  top_k=4 if options else None, **options)
    np.testing.assert_array_equal(got, want)

  def test_cached_equals_the_uncached_rerun_sampled(self):
    self._cached_equals_the_uncached_rerun(1, dict(temperature=0.8, top_p=0.9))

  @pytest.mark.slow
  def test_cached_equals_the_uncached_rerun_greedy(self):
    self._cached_equals_the_uncached_rerun(None, {})

  def _each_row_equals_its_prompt_alone(self, seed):
    model = _lm('alibi')
    options = {} if seed is None else dict(key=jax.random.key(seed), top_k=6)
    got = aj.generate(model, self.PROMPT, 5, prompt_lengths=self.LENGTHS, **options)
    chex.assert_shape(got, (3, 10))
    for r, n in enumerate(self.LENGTHS):
      alone = dict(options)
      if seed is not None:  # row r's key: split(key, B)[r], as a batch of one
        alone['key'] = jax.random.split(options['key'], 3)[r:r + 1]
      want = aj.generate(model, self.PROMPT[r:r + 1, :n], 5, **alone)
      np.testing.assert_array_equal(got[r, :n + 5], want[0])
      np.testing.assert_array_equal(got[r, n + 5:], 0)  # pad_id

  def test_each_row_equals_its_prompt_alone_sampled(self):
    self._each_row_equals_its_prompt_alone(2)

  @pytest.mark.slow
  def test_each_row_equals_its_prompt_alone_greedy(self):
    self._each_row_equals_its_prompt_alone(None)

  def test_sampled_rows_and_steps_are_distinct_draws(self):
    # Fixed logits: every token of every row is one draw from the same
    # distribution; shared keys across rows or steps would fail the counts.
    logits = jnp.array([1.0, 0.0, 2.0, -1.0])
    model = FixedLogits(logits)
    b, n, t = 2000, 4, 0.7
    out = aj.generate(model, jnp.zeros((b, 1), jnp.int32), n, key=jax.random.key(8),
                      temperature=t)
    want = np.asarray(jax.nn.softmax(logits / t))
    for step in range(1, n + 1):
      freq = np.bincount(np.asarray(out[:, step]), minlength=4) / b
      self.assertTrue((np.abs(freq - want) <= 5 * np.sqrt(want * (1 - want) / b)).all(),
                      (step, freq, want))
    # Consecutive steps of a row are independent: agreement is sum(p^2).
    same = np.mean(np.asarray(out[:, 1]) == np.asarray(out[:, 2]))
    self.assertLess(abs(same - (want ** 2).sum()), 5 * np.sqrt(0.25 / b))

  @pytest.mark.slow
  def test_rows_stop_at_their_eos(self):
    model = _lm()
    plain = np.asarray(aj.generate(model, self.PROMPT, 6, prompt_lengths=self.LENGTHS))
    eos = int(plain[0, 5 + 2])  # row 0's third generated token
    got = np.asarray(aj.generate(model, self.PROMPT, 6, prompt_lengths=self.LENGTHS,
                                 eos_id=eos, pad_id=10))
    np.testing.assert_array_equal(got, _rerun(model, self.PROMPT, self.LENGTHS, 6,
                                              eos_id=eos, pad_id=10))
    for r, n in enumerate(self.LENGTHS):
      generated = list(plain[r, n:n + 6])
      end = n + (generated.index(eos) + 1 if eos in generated else 6)
      np.testing.assert_array_equal(got[r, :end], plain[r, :end])
      np.testing.assert_array_equal(got[r, end:], 10)
    self.assertLessEqual(np.sum(got[0] == 10), 6)

  def test_eos_in_a_prompt_ends_nothing(self):
    model = FixedLogits(jnp.array([0.0, 5.0, 0.0]))  # always token 1
    got = aj.generate(model, jnp.array([[2, 2, 2]]), 3, eos_id=2)
    np.testing.assert_array_equal(got, [[2, 2, 2, 1, 1, 1]])

  def test_decoding_stops_when_every_row_is_done(self):
    model = FixedLogits(jnp.array([0.0, 0.0, 9.0, 0.0]))  # always EOS (2)
    STARTS.clear()
    got = aj.generate(model, jnp.array([[1, 1, 1], [1, 3, 3]]), 20, eos_id=2, pad_id=0,
                      prompt_lengths=jnp.array([3, 1]))
    jax.effects_barrier()
    np.testing.assert_array_equal(got[:, :5], [[1, 1, 1, 2, 0], [1, 2, 0, 0, 0]])
    np.testing.assert_array_equal(got[:, 5:], 0)
    # The prefill, then steps 0 … 2 (row 1's EOS, then row 0's): not 22.
    self.assertEqual(STARTS, [0, 0, 1, 2])
    STARTS.clear()
    aj.generate(model, jnp.array([[1, 1, 1], [1, 3, 3]]), 20, pad_id=0,
                prompt_lengths=jnp.array([3, 1]))
    jax.effects_barrier()
    self.assertEqual(STARTS, [0] + list(range(22)))  # without eos_id: all

  @pytest.mark.slow
  def test_invalid_traced_values_poison_the_output(self):
    model = _lm()
    run = jax.jit(lambda l, t: aj.generate(model, self.PROMPT, 3, prompt_lengths=l,
                                           key=jax.random.key(0), temperature=t))
    got = np.asarray(run(jnp.array([5, 0, 4]), 1.0))
    np.testing.assert_array_equal(got[1], -1)  # the row with the bad length
    self.assertTrue((got[[0, 2]] >= 0).all())
    got = np.asarray(run(self.LENGTHS, -1.0))
    for r, n in enumerate(self.LENGTHS):
      np.testing.assert_array_equal(got[r, :n], self.PROMPT[r, :n])
      np.testing.assert_array_equal(got[r, n:], -1)

  def test_numpy_and_concrete_jax_ints_are_ints(self):
    model = FixedLogits(jnp.array([0.0, 1.0, 2.0, 0.5]))
    prompt = jnp.array([[1, 2], [3, 0]])
    want = aj.generate(model, prompt, 3, key=jax.random.key(0), top_k=2, eos_id=2, pad_id=3)
    got = aj.generate(model, prompt, np.int64(3), key=jax.random.key(0), top_k=jnp.int32(2),
                      eos_id=np.int32(2), pad_id=jnp.array(3))
    np.testing.assert_array_equal(got, want)

  def test_zero_tokens_returns_the_prompts(self):
    model = _lm()
    np.testing.assert_array_equal(aj.generate(model, self.PROMPT, 0), self.PROMPT)
    got = aj.generate(model, self.PROMPT, 0, prompt_lengths=self.LENGTHS, pad_id=7)
    np.testing.assert_array_equal(
        got, np.where(np.arange(5) < self.LENGTHS[:, None], self.PROMPT, 7))

  @parameterized.named_parameters(
      ('float_prompt', dict(prompt=[[1.7, 2.2]]), TypeError,
       r'prompt must be int token ids.*dtype float64 \(e.g. 1.7\)'),
      ('negative_num_tokens', dict(num_tokens=-1), ValueError, r'num_tokens must be >= 0, got -1'),
      ('float_num_tokens', dict(num_tokens=2.0), TypeError, r'num_tokens=2.0 must be a Python int'),
      ('bool_num_tokens', dict(num_tokens=True), TypeError, r'num_tokens=True'),
      ('temperature_without_key', dict(temperature=0.5), ValueError,
       r'temperature=0.5 samples, which needs key='),
      ('top_k_without_key', dict(top_k=2, top_p=0.5), ValueError,
       r'top_k=2, top_p=0.5 samples, which needs key='),
      ('negative_temperature', dict(key=0, temperature=-1.0), ValueError,
       r'temperature=-1.0 is not allowed'),
      ('nan_temperature', dict(key=0, temperature=float('nan')), ValueError,
       r'temperature=nan is not allowed'),
      ('top_k_past_vocab', dict(key=0, top_k=12), ValueError, r'top_k=12 .*1 … 11'),
      ('top_k_0', dict(key=0, top_k=0), ValueError, r'top_k=0'),
      ('top_p_0', dict(key=0, top_p=0.0), ValueError, r'top_p=0.0 .*\(0, 1\]'),
      ('top_p_past_1', dict(key=0, top_p=1.01), ValueError, r'top_p=1.01'),
      ('length_0', dict(prompt_lengths=[0, 2]), ValueError,
       r'prompt_lengths holds 0: each must be in 1 … 3'),
      ('length_past_prompt', dict(prompt_lengths=[3, 4]), ValueError,
       r'prompt_lengths holds 4: each must be in 1 … 3'),
      ('lengths_shape', dict(prompt_lengths=[3]), ValueError,
       r'prompt_lengths must be int \[batch\] = \[2\], got shape \(1,\)'),
      ('float_lengths', dict(prompt_lengths=[3.0, 2.0]), ValueError, r'dtype float32'),
      ('eos_past_vocab', dict(eos_id=11), ValueError,
       r'eos_id=11 is outside the vocabulary 0 … 10'),
      ('negative_pad', dict(pad_id=-1), ValueError, r'pad_id=-1 is outside the vocabulary'),
      ('pad_past_vocab', dict(pad_id=11), ValueError, r'pad_id=11 is outside the vocabulary'),
      ('raw_key', dict(key=jnp.zeros(2, jnp.uint32)), TypeError,
       r'key must be a jax.random.key.*wrap_key_data'),
      ('keys_shape', dict(key=jax.random.split(jax.random.key(0), 3)), ValueError,
       r'one per row \(shape \(2,\)\), got shape \(3,\)'))
  def test_bad_arguments_are_refused(self, args, error, message):
    args = dict(dict(prompt=[[1, 2, 3], [4, 5, 6]], num_tokens=2), **args)
    if isinstance(args.get('key'), int):
      args['key'] = jax.random.key(args['key'])
    model = _lm()
    with self.assertRaisesRegex(error, message):
      aj.generate(model, args.pop('prompt'), args.pop('num_tokens'), **args)

  def test_positions_past_the_model_keep_their_error(self):
    model = aj.TransformerLM(vocab_size=V, d_model=16, num_heads=4, num_layers=1, mlp_dim=32,
                             encoding='learned', max_positions=8, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r'a cache of 9 slots'):
      aj.generate(model, jnp.ones((2, 4), jnp.int32), 5, key=jax.random.key(0),
                  prompt_lengths=jnp.array([4, 2]))


if __name__ == '__main__':
  absltest.main()
