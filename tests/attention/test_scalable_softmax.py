"""Scalable softmax: logits × s_h · log(n), n the keys a query may see."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
import pytest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.attention.scalable import visible_keys
from attention_jax.lab.config.validate import validate_config
from configs import copy as copy_config

B, T, D_MODEL, H = 2, 12, 16, 4


def _mha(**kw):
  return aj.MultiHeadAttention(D_MODEL, H, causal=True, scalable_softmax=0.7, rngs=nnx.Rngs(0),
                               **kw)


class ScalableSoftmaxTest(chex.TestCase, parameterized.TestCase):

  @parameterized.product(causal=(True, False), window=(None, 3), padded=(False, True))
  def test_visible_keys_count_the_mask(self, causal, window, padded):
    kv_lengths = np.array([T, 7]) if padded else None
    got = visible_keys(np.arange(T), T, causal=causal, window=window, kv_lengths=kv_lengths)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    keep = np.ones((T, T), bool)
    if causal:
      keep &= j <= i
    if window:
      keep &= np.abs(i - j) < window
    lengths = kv_lengths if padded else np.array([T])
    want = np.stack([(keep & (j < n)).sum(-1) for n in lengths])
    np.testing.assert_array_equal(np.broadcast_to(got, want.shape), want)

  def test_logits_are_scaled_by_s_log_n(self):
    """The weights equal a softmax of (s_h · log(i + 1)) · q·k/√d + ALiBi's bias."""
    mha = _mha(encoding='alibi', implementation='dense')
    x = jax.random.normal(jax.random.key(1), (B, T, D_MODEL))
    _, weights = mha(x, return_weights=True)
    q, k = mha.W_Q(x), mha.W_K(x)
    scale = np.asarray(mha.ssmax_scale[...])[None, :, None, None]
    logits = np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(D_MODEL // H)
    logits = logits * scale * np.log(np.arange(1, T + 1))[None, None, :, None]
    logits = logits + np.asarray(aj.positional.alibi_bias(H, T, T))[None]
    logits = np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf)
    want = np.exp(logits - logits.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, want, atol=1e-5)

  def test_chunked_equals_dense(self):
    x = jax.random.normal(jax.random.key(2), (B, 40, D_MODEL))
    outs = [_mha(encoding='alibi', implementation=impl, chunk_size=8)(x)
            for impl in ('dense', 'chunked')]
    chex.assert_trees_all_close(outs[0], outs[1], atol=1e-5)

  def test_causal_by_gradients(self):
    mha = _mha(encoding='rope')
    x = jax.random.normal(jax.random.key(3), (1, T, D_MODEL))
    grad = jax.grad(lambda x: mha(x)[0, 5].sum())(x)
    self.assertTrue(np.all(np.asarray(grad)[0, 6:] == 0))
    self.assertTrue(np.any(np.asarray(grad)[0, :6] != 0))

  def test_s_is_learned_per_head(self):
    mha = _mha(encoding='alibi')
    x = jax.random.normal(jax.random.key(4), (B, T, D_MODEL))
    grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(mha)
    self.assertEqual(grads.ssmax_scale[...].shape, (H,))
    self.assertTrue(np.all(np.asarray(grads.ssmax_scale[...]) != 0))

  @parameterized.named_parameters(('alibi', 'alibi'), ('rope', 'rope'),
                                  ('window_rope', 'rope', 4))
  @pytest.mark.slow
  def test_cached_decoding_equals_full_pass(self, encoding, window=None):
    model = aj.TransformerLM(vocab_size=11, d_model=D_MODEL, num_heads=H, num_layers=2,
                             mlp_dim=32, encoding=encoding, sliding_window=window,
                             scalable_softmax=0.5, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(5), (2, T), 0, 11)
    want = model(tokens)
    cache = model.init_cache(2, T)
    got, cache = model.extend(tokens[:, :4], cache, 0)
    pieces = [got]
    for i in range(4, T):
      logits, cache = model.extend(tokens[:, i:i + 1], cache, i)
      pieces.append(logits)
    chex.assert_trees_all_close(jnp.concatenate(pieces, 1), want, atol=2e-5)

  def test_bad_values_are_errors(self):
    with self.assertRaisesRegex(ValueError, r'scalable_softmax=-1.0: the initial s must be > 0'):
      aj.MultiHeadAttention(D_MODEL, H, causal=True, scalable_softmax=-1.0, rngs=nnx.Rngs(0))
    c = copy_config.get_config('scale=tiny,encoding=alibi')
    c.model.scalable_softmax = -0.5
    with self.assertRaisesRegex(ValueError, r'model.scalable_softmax=-0.5 must be >= 0'):
      validate_config(c)


if __name__ == '__main__':
  absltest.main()
