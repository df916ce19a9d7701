"""Multi-Token Attention's key-query convolution against the official code's steps."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
import pytest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.positional import mta


def _official_mta_scores(q, k, theta, pad_key, hidden=None):
  """NumPy transcription of `Attention._mta_convolution` (facebookresearch/RAM,
  projects/mta/mta_transformer.py) on a causal pass: scores q·k/√D, masked
  entries set to 0, padded by (c_q − 1, 0) on queries and by `pad_key` on
  keys, then `F.conv2d` (a cross-correlation, groups = heads), then -inf above
  the diagonal. q, k `[B, T, H, D]`, theta `[H, c_q, c_k]` -> `[B, H, T, T]`."""
  b, t, h, d = q.shape
  _, c_q, c_k = theta.shape
  scores = np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(d)
  future = np.triu(np.ones((t, t), bool), 1)
  if hidden is not None:  # a mask (True = attend) on top of the causal one
    future = future | ~hidden
  scores = np.where(future, 0.0, scores)
  left = {'both': (c_k - 1) // 2, 'left': c_k - 1, 'right': 0}[pad_key]
  padded = np.pad(scores, ((0, 0), (0, 0), (c_q - 1, 0), (left, c_k - 1 - left)))
  out = np.zeros_like(scores)
  for i in range(t):
    for j in range(t):
      out[:, :, i, j] = np.einsum('hrc,bhrc->bh', theta, padded[:, :, i:i + c_q, j:j + c_k])
  return np.where(future, -np.inf, out)


def _random(shape, key):
  return np.asarray(jax.random.normal(jax.random.key(key), shape), np.float64)


class KeyQueryConvolutionTest(chex.TestCase, parameterized.TestCase):

  @parameterized.product(pad_key=('both', 'left', 'right'), kernel=((3, 5), (1, 1), (4, 3)))
  def test_logits_equal_the_official_convolution(self, pad_key, kernel):
    c_q, c_k = kernel
    q, k = _random((2, 7, 3, 4), 0), _random((2, 7, 3, 4), 1)
    theta = _random((3, c_q, c_k), 2)
    enc = mta.MultiTokenAttention(3, c_q, c_k, pad_key)
    enc.kernel[...] = jnp.asarray(theta, jnp.float32)
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    bias = enc.score_contribution(aj.positional.ScoreContext(
        q=f32(q), k=f32(k), q_positions=np.arange(7), k_positions=np.arange(7),
        q_slots=np.arange(7), q_history=f32(q))).bias
    logits = np.asarray(bias) + np.einsum('bqhd,bkhd->bhqk', q, k) / 2.0  # + the kernel's S
    want = _official_mta_scores(q, k, theta, pad_key)
    visible = np.isfinite(want)
    np.testing.assert_allclose(logits[visible], want[visible], atol=2e-5)

  def test_identity_kernel_is_plain_attention_bit_for_bit(self):
    model = _lm('mta')
    nope = _lm('none')
    x = jax.random.randint(jax.random.key(3), (2, 10), 0, 11)
    chex.assert_trees_all_equal(model(x), nope(x))

  def test_causal_and_cached_decoding_equals_the_full_pass(self):
    model = _lm('mta', query_kernel_size=3, key_kernel_size=3)
    for block in model.blocks:  # a kernel away from the identity
      theta = block.attention.positional.kernel
      theta[...] = theta[...] + 0.3 * jax.random.normal(jax.random.key(4), theta.shape)
    x = jax.random.randint(jax.random.key(5), (2, 7), 0, 11)
    full = model(x)
    later = x.at[:, 4:].set((x[:, 4:] + 1) % 11)
    chex.assert_trees_all_close(model(later)[:, :4], full[:, :4], atol=1e-6)
    extend = nnx.jit(lambda m, tokens, cache, start: m.extend(tokens, cache, start))
    cache = model.init_cache(2, 7)
    steps = []
    for t in range(7):  # one compiled step, the slot traced
      out, cache = extend(model, x[:, t:t + 1], cache, jnp.int32(t))
      steps.append(out)
    chex.assert_trees_all_close(jnp.concatenate(steps, axis=1), full, atol=1e-5)
    prompt, cache = model.extend(x[:, :5], model.init_cache(2, 7), 0)  # a prompt, then a step
    rest, _ = model.extend(x[:, 5:], cache, 5)
    chex.assert_trees_all_close(jnp.concatenate([prompt, rest], axis=1), full, atol=1e-5)

  def test_a_caller_mask_hides_from_earlier_queries_what_it_hides_from_them(self):
    mha = aj.MultiHeadAttention(16, 2, causal=True, encoding='mta', rngs=nnx.Rngs(0),
                                encoding_options=dict(query_kernel_size=3, key_kernel_size=3))
    theta = mha.positional.kernel
    theta[...] = theta[...] + 0.5 * jax.random.normal(jax.random.key(7), theta.shape)
    x = jax.random.normal(jax.random.key(8), (2, 7, 16))
    chex.assert_trees_all_close(mha(x, mask=aj.causal_mask(7)), mha(x), atol=1e-6)
    # Key 2 hidden from every query: as if its scores were never there.
    hidden = jnp.ones((7, 7), bool).at[:, 2].set(False) & aj.causal_mask(7)
    bias = mha.positional.score_contribution(aj.positional.ScoreContext(
        q=mha.W_Q(x), k=mha.W_K(x), q_positions=np.arange(7), k_positions=np.arange(7),
        q_slots=np.arange(7), q_history=mha.W_Q(x), mask=hidden[None, None])).bias
    q, k = np.asarray(mha.W_Q(x), np.float64), np.asarray(mha.W_K(x), np.float64)
    want = _official_mta_scores(q, k, np.asarray(theta[...], np.float64), 'both',
                                hidden=np.asarray(hidden))
    logits = np.asarray(bias) + np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(8)
    visible = np.broadcast_to(np.asarray(hidden), logits.shape)
    np.testing.assert_allclose(logits[visible], want[visible], atol=2e-5)

  @pytest.mark.slow
  def test_the_kernel_is_trained(self):
    model = _lm('mta', query_kernel_size=2, key_kernel_size=3)
    x = jax.random.randint(jax.random.key(6), (2, 8), 0, 11)
    grads = nnx.grad(lambda m: jnp.sum(jnp.sin(m(x))))(model)
    for layer in range(2):
      kernel = grads.blocks[layer].attention.positional.kernel[...]
      self.assertGreater(float(jnp.abs(kernel).sum()), 0.0)

  @parameterized.parameters(
      (dict(query_kernel_size=0), r'query_kernel_size=0 must be an integer >= 1'),
      (dict(key_kernel_size=4), r"key_kernel_size=4 must be odd with pad_key='both'"),
      (dict(pad_key='centre'), r"pad_key='centre'; choose one of"),
  )
  def test_bad_options_are_clear_errors(self, options, message):
    with self.assertRaisesRegex(ValueError, message):
      aj.make_encoding('mta', d_model=16, num_heads=4, **options)

  def test_bidirectional_attention_is_refused(self):
    with self.assertRaisesRegex(ValueError, 'mta: the key-query convolution is causal'):
      aj.make_encoding('mta', d_model=16, num_heads=4, causal=False)


def _lm(encoding, **options):
  return aj.TransformerLM(vocab_size=11, d_model=16, num_heads=4, num_layers=2, mlp_dim=32,
                          encoding=encoding, max_positions=32, encoding_options=options,
                          rngs=nnx.Rngs(0))


if __name__ == '__main__':
  absltest.main()
