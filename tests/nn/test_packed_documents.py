"""Packed documents through the modules: a TransformerLM row holding several
documents (segment_ids, positions restarting per document) gives, document
by document, the logits and the parameter gradients of each document run
alone, for every registered encoding and on each kernel that serves segment
ids; a packed row decoded through the key/value cache gives the full
pass's logits; padding attends to nothing; what cannot serve packed rows
says so."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj

LENGTHS = (5, 8, 3)  # three documents in one row
T, VOCAB = sum(LENGTHS), 11
FAST = ('rope', 'fox', 'cope', 'mta')


def _model(encoding, *, seed=0, **options):
  model = aj.TransformerLM(vocab_size=VOCAB, d_model=16, num_heads=2, num_layers=1,
                           mlp_dim=32, encoding=encoding, max_positions=32,
                           rngs=nnx.Rngs(seed), **options)
  # Every parameter moved off its initial value: encodings that start as the
  # identity (MTA's kernel, gates at zero) then act.
  graphdef, state = nnx.split(model)
  keys = iter(jax.random.split(jax.random.key(seed + 1), len(jax.tree.leaves(state))))
  state = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(next(keys), p.shape, p.dtype),
                       state)
  return graphdef, state


def _tokens():
  return jnp.asarray(np.random.RandomState(0).randint(0, VOCAB, (1, T)), jnp.int32)


def _ids():
  return jnp.asarray(np.repeat(np.arange(len(LENGTHS)), LENGTHS)[None], jnp.int32)


def _check_packed_equals_alone(graphdef, state, tokens, **call):
  """Packed logits and gradients = the documents' own, one by one.

  The documents alone run as one batch, each left-aligned in its own row
  and padded at the end: the model is causal, so a document's logits (and
  the gradients of a loss on them) do not depend on what follows it; one
  program instead of one per length."""

  def run(valid=None, **kw):
    def loss(s, t):
      logits = nnx.merge(graphdef, s)(t, **kw)
      weights = 1.0 if valid is None else valid[..., None]
      return jnp.sum(jnp.sin(logits) * weights), logits
    return jax.jit(jax.value_and_grad(loss, has_aux=True))

  (_, packed), grad_packed = run(segment_ids=_ids(), **call)(state, tokens)
  starts = np.cumsum((0,) + LENGTHS[:-1])
  index = np.minimum(starts[:, None] + np.arange(max(LENGTHS))[None], T - 1)
  valid = jnp.asarray(np.arange(max(LENGTHS))[None] < np.array(LENGTHS)[:, None])
  (_, alone), grad_alone = run(valid)(state, tokens[0][index])
  for doc, (start, length) in enumerate(zip(starts, LENGTHS)):
    chex.assert_trees_all_close(packed[0, start:start + length], alone[doc, :length],
                                atol=2e-5)
  # The packed loss is the sum of the documents' losses.
  chex.assert_trees_all_close(grad_packed, grad_alone, atol=1e-4)


class PackedDocumentsTest(chex.TestCase, parameterized.TestCase):

  # One encoding of each way of reading positions in the fast tier: a
  # rotation, cumulative gates, the mask (CoPE's counts), MTA's
  # convolution; the slow tier runs every other registered encoding.
  @parameterized.named_parameters((e, e) for e in FAST)
  def test_packed_documents_equal_each_alone_for_every_encoding(self, encoding):
    _check_packed_equals_alone(*_model(encoding, implementation='dense'), _tokens())

  @parameterized.named_parameters((e, e) for e in sorted(set(aj.ENCODINGS) - set(FAST)))
  @pytest.mark.slow
  def test_packed_documents_equal_each_alone_for_every_encoding_slow(self, encoding):
    _check_packed_equals_alone(*_model(encoding, implementation='dense'), _tokens())

  # The encodings whose score specs the blockwise kernel builds (none,
  # rotations, forgetting attention's DifferenceBias).
  @parameterized.named_parameters(('none', 'none'), ('fox', 'fox'))
  def test_packed_documents_equal_each_alone_on_chunked(self, encoding):
    _check_packed_equals_alone(*_model(encoding, implementation='chunked'), _tokens())

  @parameterized.named_parameters(('rope', 'rope'), ('xpos', 'xpos'))
  @pytest.mark.slow
  def test_packed_documents_equal_each_alone_on_chunked_slow(self, encoding):
    _check_packed_equals_alone(*_model(encoding, implementation='chunked'), _tokens())

  # Gemma 2's soft cap and gpt-oss's sink logits on every layer: the packed
  # row's gradients, the sink logits' among them, are the documents' summed.
  @parameterized.named_parameters(('dense', 'dense'), ('chunked', 'chunked'))
  def test_packed_documents_with_soft_cap_and_sinks(self, implementation):
    _check_packed_equals_alone(*_model('rope', implementation=implementation,
                                       logit_soft_cap=2.0, sinks=True), _tokens())

  # ALiBi's LinearBias is on token indices: with static positions 0 … T-1
  # (not restarting) it is exact for contiguous documents, since it reads
  # only i - j, and the blockwise kernel builds it.
  def test_packed_documents_alibi_linear_bias_on_chunked(self):
    graphdef, state = _model('alibi', implementation='chunked')
    _check_packed_equals_alone(graphdef, state, _tokens(),
                               positions=np.arange(T, dtype=np.int32))

  def test_padding_mask_hides_padding_and_stays_finite(self):
    graphdef, state = _model('rope', implementation='dense')
    model = nnx.merge(graphdef, state)
    tokens = _tokens()
    real = jnp.asarray((np.arange(T) < 10)[None])
    padded = model(tokens, padding_mask=real)
    self.assertTrue(bool(jnp.isfinite(padded).all()))
    chex.assert_trees_all_close(padded[:, :10], model(tokens[:, :10]), atol=2e-5)
    # Other padding tokens change nothing.
    other = tokens.at[:, 10:].set(0)
    chex.assert_trees_all_close(model(other, padding_mask=real)[:, :10], padded[:, :10],
                                atol=1e-6)
    grads = jax.grad(lambda s: jnp.sum(nnx.merge(graphdef, s)(tokens, padding_mask=real)))(
        state)
    self.assertTrue(all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads)))

  def test_padding_mask_with_segment_ids(self):
    graphdef, state = _model('alibi', implementation='dense')
    model = nnx.merge(graphdef, state)
    tokens, ids = _tokens(), _ids()
    real = jnp.asarray((np.arange(T) < LENGTHS[0] + LENGTHS[1])[None])
    out = model(tokens, segment_ids=ids, padding_mask=real)
    chex.assert_trees_all_close(out[:, LENGTHS[0]:LENGTHS[0] + LENGTHS[1]],
                                model(tokens[:, LENGTHS[0]:LENGTHS[0] + LENGTHS[1]]),
                                atol=2e-5)

  @parameterized.parameters('float32', 'bfloat16', 'float16')
  def test_packed_documents_multi_head_attention_in_every_dtype(self, dtype):
    mha = aj.MultiHeadAttention(16, 2, causal=True, encoding='rope', dtype=dtype,
                                rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (1, T, 16)).astype(dtype)
    ids = _ids()
    out = mha(x, segment_ids=ids, positions=aj.segment_positions(ids))
    self.assertEqual(out.dtype, jnp.dtype(dtype))
    start = 0
    for length in LENGTHS:
      alone = mha(x[:, start:start + length])
      chex.assert_trees_all_close(out[:, start:start + length].astype(jnp.float32),
                                  alone.astype(jnp.float32),
                                  atol={'float32': 1e-5, 'bfloat16': 3e-2,
                                        'float16': 3e-3}[dtype])
      start += length

  def test_packed_documents_cross_attention(self):
    mha = aj.MultiHeadAttention(16, 2, causal=False, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (1, 6, 16))
    context = jax.random.normal(jax.random.key(2), (1, T, 16))
    q_ids = jnp.array([[0, 0, 1, 1, 2, 2]], jnp.int32)
    out = mha(x, context, segment_ids=q_ids, context_segment_ids=_ids())
    start = 0
    for doc, length in enumerate(LENGTHS):
      alone = mha(x[:, 2 * doc:2 * doc + 2], context[:, start:start + length])
      chex.assert_trees_all_close(out[:, 2 * doc:2 * doc + 2], alone, atol=1e-5)
      start += length


def _check_cached_equals_full_pass(graphdef, state, prefill=7):
  """A packed row decoded through the cache (a prefill across a document
  boundary, then token by token, ids given where a document starts and left
  to continue the slot before elsewhere) = the full pass's logits, jitted."""
  tokens, ids = _tokens(), _ids()
  model = nnx.merge(graphdef, state)
  full = model(tokens, segment_ids=ids)
  row = np.asarray(ids)[0]

  @jax.jit
  def cached(s):
    m = nnx.merge(graphdef, s)
    logits, cache = m.extend(tokens[:, :prefill], m.init_cache(1, T + 2), 0,
                             segment_ids=ids[:, :prefill])
    pieces = [logits]
    for i in range(prefill, T):
      starts = row[i] != row[i - 1]  # a document starts at slot i
      logits, cache = m.extend(tokens[:, i:i + 1], cache, jnp.int32(i),
                               segment_ids=ids[:, i:i + 1] if starts else None)
      pieces.append(logits)
    return jnp.concatenate(pieces, 1), cache

  logits, cache = cached(state)
  chex.assert_trees_all_close(logits, full, atol=2e-5, rtol=2e-5)
  np.testing.assert_array_equal(cache[0]['segment_ids'][0, :T], ids[0])
  np.testing.assert_array_equal(cache[0]['positions'][0, :T], aj.segment_positions(ids)[0])


class PackedCacheTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters((e, e) for e in ('rope', 'fox', 'cope', 'mta', 'path_fox'))
  def test_packed_prompt_through_the_cache_equals_the_full_pass(self, encoding):
    _check_cached_equals_full_pass(*_model(encoding, implementation='dense'))

  @parameterized.named_parameters(
      (e, e) for e in sorted(set(aj.ENCODINGS) - {'rope', 'fox', 'cope', 'path_fox', 'mta'}))
  @pytest.mark.slow
  def test_packed_prompt_through_the_cache_equals_the_full_pass_slow(self, encoding):
    _check_cached_equals_full_pass(*_model(encoding, implementation='dense'))

  @parameterized.named_parameters(('rope', 'rope'), ('path', 'path'), ('learned', 'learned'))
  def test_generate_from_a_packed_prompt_continues_its_last_document(self, encoding):
    # Two rows: three documents, and two documents then padding
    # (prompt_lengths); each row generates what its last document alone does.
    model = nnx.merge(*_model(encoding, implementation='dense'))
    tokens, ids = _tokens(), _ids()
    prompt = jnp.concatenate([tokens, tokens.at[:, 13:].set(0)])
    packed = jnp.concatenate([ids, ids.at[:, 13:].set(7)])
    lengths = jnp.asarray([T, 13], jnp.int32)
    got = jax.jit(lambda p, i, n: aj.generate(model, p, 5, segment_ids=i, prompt_lengths=n))(
        prompt, packed, lengths)
    np.testing.assert_array_equal(got[0, T:], aj.generate(model, tokens[:, 13:], 5)[0, 3:])
    np.testing.assert_array_equal(got[1, 13:18], aj.generate(model, tokens[:, 5:13], 5)[0, 8:])
    with self.assertRaisesRegex(ValueError, 'give positions= or segment_ids=, not both'):
      aj.generate(model, tokens, 2, segment_ids=ids, positions=jnp.arange(T + 2))
    with self.assertRaisesRegex(ValueError, r'segment_ids must be int \[B, P\] = \[1, 16\]'):
      aj.generate(model, tokens, 2, segment_ids=ids[:, :4])

  def test_a_cache_without_ids_is_one_document_as_before(self):
    # No ids given: the cache keeps no segment_ids and decodes as it did.
    model = nnx.merge(*_model('rope'))
    logits, cache = model.extend(_tokens(), model.init_cache(1, T), 0)
    self.assertNotIn('segment_ids', cache[0])
    chex.assert_trees_all_close(logits, model(_tokens()), atol=2e-5, rtol=2e-5)


class PackedRefusalTest(parameterized.TestCase):

  def test_packed_cache_refusals_name_the_reason(self):
    abacus = aj.TransformerLM(vocab_size=VOCAB, d_model=16, num_heads=2, num_layers=1,
                              mlp_dim=32, abacus=dict(digit_tokens=tuple(range(10)), rows=32),
                              rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r'extend\(segment_ids=...\) with Abacus'):
      abacus.extend(_tokens(), abacus.init_cache(1, 32), 0, segment_ids=_ids())
    mha = aj.MultiHeadAttention(16, 2, causal=True, scalable_softmax=1.0, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, 'segment_ids= with scalable_softmax'):
      mha.extend(jnp.ones((1, T, 16)), mha.init_cache(1, T), 0, segment_ids=_ids())
    model = nnx.merge(*_model('rope'))
    with self.assertRaisesRegex(ValueError, r'segment_ids has shape \(1, 3\)'):
      model.extend(_tokens(), model.init_cache(1, 32), 0, segment_ids=jnp.zeros((1, 3), int))
    with self.assertRaisesRegex(TypeError, 'segment_ids must be integer'):
      model.extend(_tokens(), model.init_cache(1, 32), 0, segment_ids=jnp.zeros((1, T)))

  def test_segment_ids_while_decoding_are_refused(self):
    mha = aj.MultiHeadAttention(16, 2, causal=True, rngs=nnx.Rngs(0))
    mha.init_cache((1, 8, 16))
    with self.assertRaisesRegex(ValueError, 'segment_ids= with decode=True: .* extend'):
      mha(jnp.ones((1, 1, 16)), decode=True, segment_ids=jnp.zeros((1, 1), jnp.int32))

  def test_segment_ids_with_scalable_softmax_are_refused(self):
    mha = aj.MultiHeadAttention(16, 2, causal=True, scalable_softmax=1.0, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, 'segment_ids= with scalable_softmax'):
      mha(jnp.ones((1, T, 16)), segment_ids=_ids())

  def test_segment_ids_with_abacus_are_refused(self):
    model = aj.TransformerLM(vocab_size=VOCAB, d_model=16, num_heads=2, num_layers=1,
                             mlp_dim=32, abacus=dict(digit_tokens=tuple(range(10)), rows=8),
                             rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, 'with Abacus embeddings'):
      model(_tokens(), segment_ids=_ids())

  def test_module_names_its_own_arguments(self):
    mha = aj.MultiHeadAttention(16, 2, causal=False, rngs=nnx.Rngs(0))
    x = jnp.ones((1, 6, 16))
    with self.assertRaisesRegex(ValueError, r'context_segment_ids has shape \(1, 5\)'):
      mha(x, jnp.ones((1, 7, 16)), segment_ids=jnp.zeros((1, 6), jnp.int32),
          context_segment_ids=jnp.zeros((1, 5), jnp.int32))
    with self.assertRaisesRegex(TypeError, 'segment_ids must be integer'):
      mha(x, segment_ids=jnp.zeros((1, 6)))
    model = nnx.merge(*_model('none'))
    with self.assertRaisesRegex(ValueError, r'padding_mask has shape \(1, 3\)'):
      model(_tokens(), padding_mask=jnp.ones((1, 3), bool))

  def test_chunked_refuses_a_dense_bias_naming_the_rows(self):
    # FIRE's bias is dense (not linear in i - j): packed or not, the
    # blockwise kernel cannot build it, and says which kernels can.
    model = nnx.merge(*_model('fire', implementation='chunked'))
    with self.assertRaisesRegex(ValueError, "implementation='chunked' cannot serve"):
      model(_tokens(), segment_ids=_ids())


if __name__ == '__main__':
  absltest.main()
