"""Grouped-query / multi-query attention, sliding windows, and cached decoding."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
import pytest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.nn.decoding import greedy_predictions
from tests import references

B, T, H, D = 2, 37, 4, 8


def _qkv(h_kv, key=0):
  keys = jax.random.split(jax.random.key(key), 3)
  q = jax.random.normal(keys[0], (B, T, H, D))
  k, v = (jax.random.normal(kk, (B, T, h_kv, D)) for kk in keys[1:])
  return q, k, v


def _lm(encoding, **kw):
  return aj.TransformerLM(vocab_size=11, d_model=16, num_heads=4, num_layers=2, mlp_dim=32,
                          encoding=encoding, max_positions=64, rngs=nnx.Rngs(0), **kw)


class GroupedQueryTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters(1, 2, 4)
  def test_each_query_head_uses_its_groups_kv_head(self, h_kv):
    q, k, v = _qkv(h_kv)
    out, weights = aj.multi_head_attention(q, k, v, mask=aj.causal_mask(T))
    group = H // h_kv
    for b in range(B):
      for h in range(H):
        want_out, want_w = references.attention(
            q[b, :, h], k[b, :, h // group], v[b, :, h // group], mask=np.tril(np.ones((T, T), bool)))
        np.testing.assert_allclose(out[b, :, h], want_out, atol=1e-5)
        np.testing.assert_allclose(weights[b, h], want_w, atol=1e-6)

  @parameterized.product(h_kv=(1, 2), window=(None, 5), strategy=('scan', 'unrolled'))
  def test_chunked_equals_dense_in_outputs_and_gradients(self, h_kv, window, strategy):
    q, k, v = _qkv(h_kv)
    lengths = jnp.array([T, 20])

    def dense(q, k, v):
      mask = aj.combine_masks(aj.causal_mask(T),
                              jnp.arange(T)[None, None, None, :] < lengths[:, None, None, None])
      if window:
        mask = mask & aj.attention.sliding_window_mask(T, T, window)
      return aj.multi_head_attention(q, k, v, mask=mask)[0]

    chunked = lambda q, k, v: aj.chunked_attention(
        q, k, v, causal=True, kv_lengths=lengths, window=window, q_chunk=8, k_chunk=8,
        strategy=strategy)
    chex.assert_trees_all_close(chunked(q, k, v), dense(q, k, v), atol=1e-5)
    loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))
    chex.assert_trees_all_close(jax.grad(loss(chunked), (0, 1, 2))(q, k, v),
                                jax.grad(loss(dense), (0, 1, 2))(q, k, v), atol=1e-5)

  def test_gqa_module_equals_mha_with_repeated_kv_weights(self):
    gqa = aj.MultiHeadAttention(32, 4, causal=True, num_kv_heads=2, encoding='rope',
                                rngs=nnx.Rngs(0))
    mha = aj.MultiHeadAttention(32, 4, causal=True, encoding='rope', rngs=nnx.Rngs(1))
    chex.assert_shape(gqa.W_K.kernel[...], (32, 2, 8))
    mha.W_Q.kernel[...] = gqa.W_Q.kernel[...]
    mha.W_O.kernel[...] = gqa.W_O.kernel[...]
    mha.W_K.kernel[...] = jnp.repeat(gqa.W_K.kernel[...], 2, axis=1)
    mha.W_V.kernel[...] = jnp.repeat(gqa.W_V.kernel[...], 2, axis=1)
    x = jax.random.normal(jax.random.key(2), (2, 9, 32))
    chex.assert_trees_all_close(gqa(x), mha(x), atol=1e-5)

  def test_bad_head_counts_are_clear_errors(self):
    with self.assertRaisesRegex(ValueError, 'num_kv_heads=3 must be >= 1 and divide num_heads=4'):
      aj.MultiHeadAttention(32, 4, causal=True, num_kv_heads=3, rngs=nnx.Rngs(0))
    q, k, v = _qkv(3)
    with self.assertRaisesRegex(ValueError, 'incompatible shapes: key/value heads'):
      aj.multi_head_attention(q, k, v)


class SlidingWindowTest(chex.TestCase, parameterized.TestCase):

  def test_mask_is_the_band(self):
    got = np.asarray(aj.attention.sliding_window_mask(6, 6, 2) & aj.causal_mask(6))
    want = np.array([[i - 2 < j <= i for j in range(6)] for i in range(6)])
    np.testing.assert_array_equal(got, want)
    with self.assertRaisesRegex(ValueError, 'window=0 must be an integer >= 1'):
      aj.attention.sliding_window_mask(6, 6, 0)

  @parameterized.parameters('scan', 'unrolled')
  def test_chunked_never_reads_blocks_outside_the_window(self, strategy):
    q, k, v = _qkv(H)
    # Keys 0…15 are outside every window of queries 24…36 (window 8): NaNs there
    # would leak into the output if those blocks were read.
    k_nan = k.at[:, :16].set(jnp.nan)
    v_nan = v.at[:, :16].set(jnp.nan)
    f = lambda k, v: aj.chunked_attention(q, k, v, causal=True, window=8, q_chunk=8,
                                          k_chunk=8, strategy=strategy)
    chex.assert_trees_all_close(f(k_nan, v_nan)[:, 24:], f(k, v)[:, 24:], atol=1e-6)

  def test_module_window_matches_a_dense_mask(self):
    mha = aj.MultiHeadAttention(16, 2, causal=True, sliding_window=3, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (1, 10, 16))
    _, weights = mha(x, return_weights=True)
    band = np.asarray(aj.attention.sliding_window_mask(10, 10, 3) & aj.causal_mask(10))
    self.assertTrue(np.all(np.asarray(weights)[0][:, ~band] == 0))
    np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, atol=1e-6)


class CachedDecodingTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      (f'{e}_{variant}', e, variant) for e in sorted(aj.ENCODINGS)
      for variant in ('plain', 'gqa_window'))
  @pytest.mark.slow
  def test_step_by_step_equals_full_forward(self, encoding, variant):
    kw = dict(num_kv_heads=1, sliding_window=4) if variant == 'gqa_window' else {}
    model = _lm(encoding, **kw)
    tokens = jax.random.randint(jax.random.key(1), (3, 12), 0, 11)
    want = model(tokens)
    cache = model.init_cache(3, 12)
    got, cache = model.extend(tokens[:, :5], cache, 0)  # prefill
    step = jax.jit(lambda t, c, i: model.extend(t, c, i))
    pieces = [got]
    for i in range(5, 12):
      logits, cache = step(tokens[:, i:i + 1], cache, jnp.int32(i))
      pieces.append(logits)
    chex.assert_trees_all_close(jnp.concatenate(pieces, 1), want, atol=2e-5)

  @parameterized.named_parameters((e, e) for e in ('learned', 'rope', 'alibi', 't5'))
  def test_explicit_positions_are_cached(self, encoding):
    model = _lm(encoding)
    tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, 11)
    positions = jnp.array([[0, 3, 4, 9, 20, 21, 40, 63], [1, 2, 5, 6, 7, 30, 31, 50]])
    want = model(tokens, positions=positions)
    cache = model.init_cache(2, 8)
    pieces = []
    for i in range(8):
      logits, cache = model.extend(tokens[:, i:i + 1], cache, i, positions=positions[:, i:i + 1])
      pieces.append(logits)
    chex.assert_trees_all_close(jnp.concatenate(pieces, 1), want, atol=2e-5)

  @parameterized.named_parameters((e, e) for e in sorted(aj.ENCODINGS))
  @pytest.mark.slow
  def test_greedy_generation_equals_repeated_full_forward(self, encoding):
    model = _lm(encoding)
    prompt = jax.random.randint(jax.random.key(3), (2, 4), 0, 11)
    t = 10
    inputs = jnp.concatenate([prompt, jnp.zeros((2, t - 4), jnp.int32)], 1)
    got = jax.jit(greedy_predictions, static_argnums=())(model, inputs, jnp.array([4, 4]))
    # Naive: rerun the whole prefix for each new token. The prefix sits in a
    # fixed-length buffer (one compilation): the model is causal, so the
    # logits at the prefix's last position ignore the zeros after it.
    seq = jnp.concatenate([prompt, jnp.zeros((2, t - 4 + 1), jnp.int32)], 1)
    full = jax.jit(lambda tokens: model(tokens))
    for n in range(4, t + 1):
      nxt = jnp.argmax(full(seq)[:, n - 1], -1).astype(jnp.int32)
      seq = seq.at[:, n].set(nxt)
    np.testing.assert_array_equal(got[:, 3:], seq[:, 4:t + 1])

  @parameterized.named_parameters(
      ('alibi', 'alibi', False), ('rope', 'rope', False), ('learned_positions', 'learned', True))
  @pytest.mark.slow
  def test_generate_equals_rerunning_the_growing_sequence(self, encoding, explicit):
    model = _lm(encoding)
    prompt = jax.random.randint(jax.random.key(4), (2, 3), 0, 11)
    positions = np.array([0, 2, 5, 6, 9, 11, 20, 30]) if explicit else None
    got = aj.generate(model, prompt, 5, positions=positions)
    chex.assert_shape(got, (2, 8))
    np.testing.assert_array_equal(got[:, :3], prompt)
    seq = prompt
    for _ in range(5):  # naive: rerun the whole prefix for each new token
      p = None if positions is None else positions[:seq.shape[1]]
      nxt = jnp.argmax(model(seq, positions=p)[:, -1], -1).astype(jnp.int32)
      seq = jnp.concatenate([seq, nxt[:, None]], 1)
    np.testing.assert_array_equal(got, seq)
    np.testing.assert_array_equal(aj.generate(model, prompt, 0), prompt)
    with self.assertRaisesRegex(ValueError, r'prompt must be int \[batch, length >= 1\]'):
      aj.generate(model, prompt[0], 2)

  def test_writing_past_the_cache_is_an_error(self):
    model = _lm('rope')
    cache = model.init_cache(1, 4)
    with self.assertRaisesRegex(ValueError, r'cache slots 3 … 4 but the cache has 4 slots'):
      model.extend(jnp.zeros((1, 2), jnp.int32), cache, 3)


if __name__ == '__main__':
  absltest.main()
