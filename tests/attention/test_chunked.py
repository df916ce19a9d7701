"""Blockwise attention equals the dense path, in outputs and gradients."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

import attention_jax as aj
from attention_jax.attention.chunked import choose_strategy
from attention_jax.attention.chunked import chunked_attention

from tests import tiers

B, T, H, D = 2, 37, 3, 8  # T not a multiple of the chunks: padding paths run
BOTH = ('scan', 'unrolled')  # the strategies ('auto' picks one of them)


def _qkv(dtype=jnp.float32, t_q=T):
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (B, t_q, H, D))
  k, v = (jax.random.normal(kk, (B, T, H, D)) for kk in keys[1:])
  return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def _dense(q, k, v, *, causal, lengths, alibi):
  mask = jnp.arange(T)[None, None, None, :] < lengths[:, None, None, None]
  if causal:
    mask = aj.combine_masks(mask, aj.causal_mask(T))
  bias = aj.positional.alibi_bias(H, q.shape[1], T)[None] if alibi else None
  return aj.multi_head_attention(q, k, v, mask=mask, bias=bias)[0]


class ChunkedAttentionTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(causal=(True, False), alibi=(True, False),
                         chunks=((8, 16), (64, 64)), strategy=BOTH)
  @tiers.fast_cases(4)  # causal with ALiBi, both chunkings and strategies; the rest: slow tier
  def test_equals_dense_in_outputs_and_gradients(self, causal, alibi, chunks, strategy):
    q, k, v = _qkv()
    lengths = jnp.array([T, 20])
    slopes = aj.positional.alibi_slopes(H) if alibi else None
    chunked = lambda q, k, v: chunked_attention(
        q, k, v, causal=causal, kv_lengths=lengths, alibi_slopes=slopes,
        strategy=strategy, q_chunk=chunks[0], k_chunk=chunks[1])
    dense = lambda q, k, v: _dense(q, k, v, causal=causal, lengths=lengths, alibi=alibi)
    chex.assert_trees_all_close(self.variant(chunked)(q, k, v), dense(q, k, v), atol=1e-5)
    loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))
    grads = self.variant(jax.grad(loss(chunked), argnums=(0, 1, 2)))(q, k, v)
    chex.assert_trees_all_close(grads, jax.grad(loss(dense), argnums=(0, 1, 2))(q, k, v),
                                atol=1e-5)

  # Row groups of 1, gcd(6, 4) = 2 and all 6 rows.
  @parameterized.product(heads_per_step=(1, 4, 6), strategy=BOTH)
  def test_any_heads_per_step_gives_the_same_result(self, heads_per_step, strategy):
    q, k, v = _qkv()
    lengths, slopes = jnp.array([T, 20]), aj.positional.alibi_slopes(H)
    f = lambda *a: jnp.sum(jnp.sin(chunked_attention(
        *a, causal=True, kv_lengths=lengths, alibi_slopes=slopes, q_chunk=8, k_chunk=16,
        heads_per_step=heads_per_step, strategy=strategy)))
    dense = lambda *a: jnp.sum(jnp.sin(
        _dense(*a, causal=True, lengths=lengths, alibi=True)))
    chex.assert_trees_all_close(jax.value_and_grad(f, argnums=(0, 1, 2))(q, k, v),
                                jax.value_and_grad(dense, argnums=(0, 1, 2))(q, k, v),
                                atol=1e-5)

  @parameterized.parameters(*BOTH)
  def test_fully_masked_rows_are_zero_with_finite_gradients(self, strategy):
    q, k, v = _qkv()
    lengths = jnp.array([0, 5])  # example 0 has no key at all
    f = lambda q, k, v: chunked_attention(q, k, v, kv_lengths=lengths, q_chunk=8, k_chunk=8,
                                          strategy=strategy)
    out = f(q, k, v)
    np.testing.assert_array_equal(out[0], 0.0)
    grads = jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2))(q, k, v)
    chex.assert_tree_all_finite(grads)
    np.testing.assert_array_equal(grads[0][0], 0.0)

  @parameterized.parameters(*BOTH)
  def test_bfloat16(self, strategy):
    q, k, v = _qkv(jnp.bfloat16)
    out = chunked_attention(q, k, v, causal=True, q_chunk=8, k_chunk=8, strategy=strategy)
    self.assertEqual(out.dtype, jnp.bfloat16)
    want = _dense(*(a.astype(jnp.float32) for a in (q, k, v)), causal=True,
                  lengths=jnp.array([T, T]), alibi=False)
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=2e-2)

  def test_rope_applied_before(self):
    q, k, v = _qkv()
    positions = np.arange(T) + 10_000
    q, k = (aj.positional.apply_rope(a, positions) for a in (q, k))
    out = chunked_attention(q, k, v, causal=True, q_chunk=16, k_chunk=16)
    want = _dense(q, k, v, causal=True, lengths=jnp.array([T, T]), alibi=False)
    chex.assert_trees_all_close(out, want, atol=1e-5)

  @parameterized.parameters(*BOTH)
  def test_causal_skips_blocks_above_the_diagonal(self, strategy):
    # A NaN in a key block that no query may see must not reach the output:
    # the block is never read, not merely masked.
    q, k, v = _qkv()
    v = v.at[:, 32:].set(jnp.nan)
    out = chunked_attention(q[:, :16], k, v, causal=True, q_chunk=16, k_chunk=16,
                            strategy=strategy)
    chex.assert_tree_all_finite(out)

  def test_auto_unrolls_up_to_its_limit(self):
    self.assertEqual(choose_strategy('auto', 2048, 2048), 'unrolled')
    self.assertEqual(choose_strategy('auto', 1, 2049), 'scan')
    self.assertEqual(choose_strategy('scan', 8, 8), 'scan')

  def test_bad_input(self):
    q, k, v = _qkv()
    with self.assertRaisesRegex(ValueError, r'\[batch, length, heads, head_dim\]'):
      chunked_attention(q[0], k, v)
    with self.assertRaisesRegex(ValueError, r'alibi_slopes must have shape \(3,\), got \(2,\)'):
      chunked_attention(q, k, v, alibi_slopes=jnp.ones(2))
    with self.assertRaisesRegex(ValueError, 'q_chunk=0 must be an integer >= 1'):
      chunked_attention(q, k, v, q_chunk=0)
    with self.assertRaisesRegex(ValueError, 'heads_per_step=0 must be an integer >= 1'):
      chunked_attention(q, k, v, heads_per_step=0)
    with self.assertRaisesRegex(ValueError, r"strategy='flash'; choose one of"):
      chunked_attention(q, k, v, strategy='flash')


# Encodings acting inside attention (the others are added to the embeddings).
IN_ATTENTION = [e for e in sorted(aj.ENCODINGS)
                if not aj.positional.embedding_only(aj.ENCODINGS[e])]


def _score_spec(mha, x, kv_lengths):
  """What `mha`'s encoding adds to the scores of `mha(x, kv_lengths=...)`,
  asked as the module asks it (`score_contribution` of the call's context)."""
  positions = np.arange(x.shape[1])
  q, k = mha.positional.rotate_queries_keys(mha.W_Q(x), mha.W_K(x), positions, positions)
  features = mha.positional.token_features(x)
  return mha.positional.score_contribution(aj.ScoreContext(
      q=q, k=k, q_positions=positions, k_positions=positions, q_slots=positions,
      q_features=features, k_features=features, kv_lengths=kv_lengths,
      q_history=q if mha.positional.reads_query_history else None))


class ModuleImplementationTest(parameterized.TestCase):

  def test_module_strategies_agree_and_bad_ones_are_refused(self):
    from flax import nnx  # pylint: disable=g-import-not-at-top
    make = lambda strategy: aj.MultiHeadAttention(
        32, 4, causal=True, encoding='alibi', implementation='chunked', chunk_size=8,
        chunked_strategy=strategy, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 21, 32))
    chex.assert_trees_all_close(make('scan')(x), make('unrolled')(x), atol=1e-5)
    with self.assertRaisesRegex(ValueError, r"chunked_strategy='fast'; choose one of"):
      make('fast')

  @parameterized.named_parameters(
      (f'{e}_{impl}', e, impl) for e in IN_ATTENTION for impl in ('chunked', 'auto'))
  @tiers.fast_cases(6)  # three encodings; every other one in the slow tier
  def test_module_paths_agree(self, encoding, implementation):
    from flax import nnx  # pylint: disable=g-import-not-at-top
    dense = aj.MultiHeadAttention(32, 4, causal=True, encoding=encoding, implementation='dense',
                                  max_positions=21, rngs=nnx.Rngs(0))
    other = aj.MultiHeadAttention(32, 4, causal=True, encoding=encoding, max_positions=21,
                                  implementation=implementation, chunk_size=8, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 21, 32))
    lengths = jnp.array([21, 9])
    want = dense(x, kv_lengths=lengths)
    spec = _score_spec(other, x, lengths)
    if implementation == 'chunked' and isinstance(spec, aj.DenseBias):
      # Non-linear biases (T5, KERPLE, …) stay on the dense kernel ('auto' falls back);
      # the refusal names the bias.
      with self.assertRaisesRegex(ValueError, re.escape(spec.origin)):
        other(x, kv_lengths=lengths)
      return
    if implementation == 'chunked' and isinstance(spec, aj.attention.WindowBias):
      # Per-head windows on position ids: built in our Pallas kernels, not blockwise.
      with self.assertRaisesRegex(ValueError, 'a window bias'):
        other(x, kv_lengths=lengths)
      return
    terms = spec if isinstance(spec, tuple) else (spec,)
    if implementation == 'chunked' and any(
        isinstance(t, aj.attention.HouseholderScores) for t in terms):
      # PaTH transforms q·k itself: its own blockwise kernel serves it, not chunked.
      with self.assertRaisesRegex(ValueError, r"a Householder transform of q·k \(PaTH\).*"
                                  r"'path_blockwise'"):
        other(x, kv_lengths=lengths)
      return
    chex.assert_trees_all_close(other(x, kv_lengths=lengths), want, atol=1e-5)

  def test_chunked_refuses_what_it_cannot_serve(self):
    from flax import nnx  # pylint: disable=g-import-not-at-top
    x = jnp.ones((1, 8, 16))
    mha = aj.MultiHeadAttention(16, 2, causal=True, implementation='chunked', rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, 'return_weights=True'):
      mha(x, return_weights=True)
    with self.assertRaisesRegex(ValueError, 'a dense mask'):
      mha(x, mask=aj.causal_mask(8))
    alibi = aj.MultiHeadAttention(16, 2, encoding='alibi', causal=False,
                                  implementation='chunked', rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, 'bidirectional.*not linear in i - j'):
      alibi(x)
    causal_alibi = aj.MultiHeadAttention(16, 2, causal=True, encoding='alibi',
                                         implementation='chunked', rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, 'return_weights=True .*; a dense bias from the bias '
                                'of ALiBi '
                                r'\(at positions other than the default 0 … T-1'):
      causal_alibi(x, positions=np.arange(8) + 5, return_weights=True)
    with self.assertRaisesRegex(ValueError, "implementation='flash'"):
      aj.MultiHeadAttention(16, 2, causal=True, implementation='flash', rngs=nnx.Rngs(0))

  def test_auto_falls_back_to_dense_for_weights(self):
    from flax import nnx  # pylint: disable=g-import-not-at-top
    mha = aj.MultiHeadAttention(16, 2, causal=True, rngs=nnx.Rngs(0))
    _, weights = mha(jnp.ones((1, 300, 16)), return_weights=True)
    chex.assert_shape(weights, (1, 2, 300, 300))


if __name__ == '__main__':
  absltest.main()
