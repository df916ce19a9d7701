"""Segment ids (packed documents): a packed row gives, document by document,
what each document gives alone, in outputs and gradients, on every kernel
that serves them; padded queries give zeros, never NaN; the refusals name
the argument, the value and the kernels that serve them. The kernels for
accelerators (Pallas, splash): test_segments_pallas.py."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest
from absl.testing import parameterized

from tests import tiers

import attention_jax as aj
from attention_jax.attention import dispatch
from attention_jax.attention.pallas_gpu import pallas_gpu_attention
from attention_jax.attention.path import HouseholderScores
from attention_jax.attention.pallas_tpu import pallas_tpu_attention
from attention_jax.attention.splash import splash_kernel
from attention_jax.attention.segments import PADDED_KEY
from attention_jax.attention.segments import PADDED_QUERY
from attention_jax.attention.segments import padding_ids

H, D = 2, 8
LENGTHS = (5, 11, 3, 9)  # four documents in one row of 28 tokens
T = sum(LENGTHS)
ATOL = {'float32': 1e-5, 'bfloat16': 2e-2, 'float16': 2e-3}
# Chunk sizes that cut documents and leave a partial last block. The scan
# comes first: sweeps keep their first cases in `make test` (tests/tiers.py),
# and the scan is the chunked path 'auto' takes.
KERNELS = {'chunked_scan': dict(chunk_size=8, chunked_strategy='scan'),
           'chunked_unrolled': dict(chunk_size=8, chunked_strategy='unrolled'), 'dense': {}}


def _ids(lengths=LENGTHS):
  return np.repeat(np.arange(len(lengths)), lengths).astype(np.int32)


def _qkv(b=1, t=T, h_kv=H, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (b, t, H, D))
  k, v = (jax.random.normal(kk, (b, t, h_kv, D)) for kk in keys[1:])
  return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def _attend(kernel, **call):
  options = dict(KERNELS[kernel])
  name = 'chunked' if kernel.startswith('chunked') else kernel
  return lambda q, k, v: aj.scaled_dot_product_attention(
      q, k, v, implementation=name, **options, **call)


def _loss(f):
  return lambda *a: jnp.sum(jnp.sin(f(*a).astype(jnp.float32)))


def _grads(f, *args):
  return jax.grad(_loss(f), argnums=(0, 1, 2))(*args)


def _assert_packed_equals_alone(packed, alone, q, k, v):
  """`packed` on the row of LENGTHS' documents gives, document by document,
  what `alone` gives on that document: outputs, and gradients (the packed
  loss is the sum of the documents' losses, so each document's slice of the
  packed gradients is its own gradient alone)."""
  out, grads, start = packed(q, k, v), _grads(packed, q, k, v), 0
  for length in LENGTHS:
    piece = lambda x: x[:, start:start + length]
    doc = [piece(x) for x in (q, k, v)]
    chex.assert_trees_all_close(piece(out), alone(*doc), atol=1e-5)
    chex.assert_trees_all_close([piece(g) for g in grads], list(_grads(alone, *doc)),
                                atol=1e-5)
    start += length


class PackedEqualsAloneTest(chex.TestCase, parameterized.TestCase):

  # (causal, window, grouped-query heads)
  @parameterized.product(kernel=tuple(KERNELS), structure=(
      (True, None, False), (True, 4, True), (False, None, True), (False, 4, False)))
  @tiers.fast_cases(4)  # the scan in every structure
  def test_segments_packed_row_equals_each_document_alone(self, kernel, structure):
    causal, window, gqa = structure
    q, k, v = _qkv(h_kv=1 if gqa else H)
    ids = jnp.asarray(_ids()[None])
    _assert_packed_equals_alone(_attend(kernel, causal=causal, window=window, segment_ids=ids),
                                _attend('dense', causal=causal, window=window), q, k, v)

  @parameterized.product(kernel=tuple(KERNELS), dtype=('float32', 'bfloat16', 'float16'))
  @tiers.fast_cases(3)  # the scan in every dtype
  def test_segments_equal_the_dense_mask_in_every_dtype(self, kernel, dtype):
    # Ids that are not runs (interleaved documents) and a batch of two rows:
    # the scan's block skipping must keep every block where an id meets.
    ids = jnp.asarray(np.stack([_ids(), np.arange(T) % 3]), jnp.int32)
    q, k, v = _qkv(b=2, dtype=jnp.dtype(dtype))
    lengths = jnp.array([T, 17])
    mask = aj.segment_mask(ids, ids)
    f = _attend(kernel, causal=True, segment_ids=ids, kv_lengths=lengths)
    ref = _attend('dense', causal=True, mask=mask, kv_lengths=lengths)
    out = f(q, k, v)
    self.assertEqual(out.dtype, jnp.dtype(dtype))
    chex.assert_trees_all_close(out.astype(jnp.float32), ref(q, k, v).astype(jnp.float32),
                                atol=ATOL[dtype])
    chex.assert_trees_all_close(
        [g.astype(jnp.float32) for g in _grads(f, q, k, v)],
        [g.astype(jnp.float32) for g in _grads(ref, q, k, v)], atol=5 * ATOL[dtype])

  @parameterized.product(kernel=tuple(KERNELS))
  @tiers.fast_cases(1)
  def test_segments_cross_attention_with_other_key_ids(self, kernel):
    t_q = 12
    q = _qkv(t=t_q)[0]
    _, k, v = _qkv()
    q_ids = jnp.asarray(np.repeat([1, 3, 2], [4, 4, 4])[None], jnp.int32)
    kv_ids = jnp.asarray(_ids()[None])
    f = _attend(kernel, segment_ids=q_ids, kv_segment_ids=kv_ids)
    ref = _attend('dense', mask=aj.segment_mask(q_ids, kv_ids))
    chex.assert_trees_all_close(f(q, k, v), ref(q, k, v), atol=1e-5)
    chex.assert_trees_all_close(_grads(f, q, k, v), _grads(ref, q, k, v), atol=1e-5)

  @parameterized.product(kernel=tuple(KERNELS), dtype=('float32', 'bfloat16', 'float16'))
  @tiers.fast_cases(3)
  def test_segments_padded_queries_give_zeros_and_finite_gradients(self, kernel, dtype):
    # The last 6 tokens are padding: as queries they meet no key (a fully
    # masked row), as keys no query meets them.
    real = jnp.asarray((np.arange(T) < T - 6)[None])
    q_ids, kv_ids = padding_ids(jnp.asarray(_ids()[None]), real)
    q, k, v = _qkv(dtype=jnp.dtype(dtype))
    f = _attend(kernel, causal=True, segment_ids=q_ids, kv_segment_ids=kv_ids)
    out, grads = f(q, k, v), _grads(f, q, k, v)
    self.assertTrue(all(bool(jnp.isfinite(g).all()) for g in (out, *grads)))
    np.testing.assert_array_equal(np.asarray(out[:, T - 6:], np.float32), 0.0)
    for g in grads:  # nothing reaches or leaves the padding
      np.testing.assert_array_equal(np.asarray(g[:, T - 6:], np.float32), 0.0)
    # The real tokens are what they are without the padding.
    alone = _attend('dense', causal=True, segment_ids=jnp.asarray(_ids()[None, :T - 6]))
    chex.assert_trees_all_close(
        out[:, :T - 6].astype(jnp.float32),
        alone(*(x[:, :T - 6] for x in (q, k, v))).astype(jnp.float32), atol=ATOL[dtype])

  @parameterized.parameters('dense', 'chunked_scan')
  def test_segments_traced_ids_under_jit(self, kernel):
    q, k, v = _qkv()
    ids = jnp.asarray(_ids()[None])
    f = lambda q, k, v, ids: _attend(kernel, causal=True, segment_ids=ids)(q, k, v)
    chex.assert_trees_all_close(jax.jit(f)(q, k, v, ids), f(q, k, v, ids), atol=1e-6)

  def test_segments_padding_ids_are_negative_and_distinct(self):
    q_ids, kv_ids = padding_ids(None, jnp.array([[True, True, False]]))
    np.testing.assert_array_equal(q_ids, [[0, 0, PADDED_QUERY]])
    np.testing.assert_array_equal(kv_ids, [[0, 0, PADDED_KEY]])
    with self.assertRaisesRegex(ValueError, 'padding_mask must be boolean'):
      padding_ids(None, jnp.array([[1, 0]]))

  def test_segment_positions_restart_with_each_document(self):
    ids = jnp.array([[0, 0, 0, 1, 1, 2], [4, 4, 4, 4, 0, 0]])
    np.testing.assert_array_equal(aj.segment_positions(ids),
                                  [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]])
    with self.assertRaisesRegex(ValueError, 'segment_ids must be integer'):
      aj.segment_positions(jnp.ones((2, 3)))

  def test_segments_stick_breaking_dense_equals_each_document_alone(self):
    q, k, v = _qkv()
    ids = jnp.asarray(_ids()[None])
    _assert_packed_equals_alone(
        _attend('dense', causal=True, normalization='stick_breaking', segment_ids=ids),
        _attend('dense', causal=True, normalization='stick_breaking'), q, k, v)


def _pallas(name, **call):
  """Our Pallas kernel `name` in interpret mode, small tiles (several per row)."""
  if name == 'pallas_gpu':
    return lambda q, k, v: pallas_gpu_attention(q, k, v, interpret=True, block_q=16,
                                                block_k=16, **call)
  return lambda q, k, v: pallas_tpu_attention(q, k, v, interpret=True, **call)


CAP = 1.5  # below the scores' spread (|s| up to ~3 here), so the tanh bends them
SINKS = jnp.array([0.7, -1.2])  # one logit per query head (H = 2)


def _sink_loss(f):
  """A loss of (q, k, v, sinks) through `f(q, k, v, sinks)`."""
  return lambda q, k, v, sinks: jnp.sum(jnp.sin(f(q, k, v, sinks).astype(jnp.float32)))


def _sink_grads(f, *args):
  return jax.grad(_sink_loss(f), argnums=(0, 1, 2, 3))(*args)


class SoftCapSinksSegmentsTest(chex.TestCase, parameterized.TestCase):
  """Segment ids with Gemma 2's soft cap and gpt-oss's sink logits: a packed
  row with both gives each document what it gives alone with both, in
  outputs and in the gradients of q, k, v and the sink logits (a packed
  loss is the sum of the documents' losses, so its sink gradient is the
  sum of theirs)."""

  def _check_against_each_document(self, packed, causal):
    q, k, v = _qkv(h_kv=1)
    out, grads = packed(q, k, v, SINKS), _sink_grads(packed, q, k, v, SINKS)
    alone = lambda q, k, v, sinks: aj.scaled_dot_product_attention(
        q, k, v, causal=causal, implementation='dense', logit_soft_cap=CAP, sinks=sinks)
    start, d_sinks = 0, jnp.zeros_like(SINKS)
    for length in LENGTHS:
      doc = [x[:, start:start + length] for x in (q, k, v)]
      chex.assert_trees_all_close(out[:, start:start + length], alone(*doc, SINKS),
                                  atol=1e-5)
      doc_grads = _sink_grads(alone, *doc, SINKS)
      chex.assert_trees_all_close([g[:, start:start + length] for g in grads[:3]],
                                  list(doc_grads[:3]), atol=1e-5)
      d_sinks = d_sinks + doc_grads[3]
      start += length
    chex.assert_trees_all_close(grads[3], d_sinks, atol=1e-5)
    self.assertGreater(float(jnp.abs(grads[3]).min()), 1e-3)  # the sinks do take part

  @parameterized.product(kernel=tuple(KERNELS), causal=(True, False))
  @tiers.fast_cases(2)
  def test_segments_with_soft_cap_and_sinks_equal_each_document_alone(self, kernel, causal):
    ids = jnp.asarray(_ids()[None])
    packed = lambda q, k, v, sinks: _attend(
        kernel, causal=causal, segment_ids=ids, logit_soft_cap=CAP, sinks=sinks)(q, k, v)
    self._check_against_each_document(packed, causal)

  @parameterized.product(name=('pallas_gpu', 'pallas_tpu'), causal=(True, False))
  @pytest.mark.slow  # interpret mode, forward and backward: ~10 s each on 2 CPU cores
  def test_segments_with_soft_cap_and_sinks_pallas_equal_each_document_alone(self, name,
                                                                             causal):
    ids = (_ids()[None],) * 2
    packed = lambda q, k, v, sinks: _pallas(
        name, causal=causal, segment_ids=ids, logit_soft_cap=CAP, sinks=sinks)(q, k, v)
    self._check_against_each_document(packed, causal)

  @parameterized.parameters(*KERNELS)
  @tiers.fast_cases(1)
  def test_segments_padded_queries_with_sinks_give_zeros_not_nan(self, kernel):
    # A padded query meets no key: the sink takes all its weight, out = 0.
    real = jnp.asarray((np.arange(T) < T - 6)[None])
    q_ids, kv_ids = padding_ids(jnp.asarray(_ids()[None]), real)
    q, k, v = _qkv()
    f = lambda q, k, v, sinks: _attend(
        kernel, causal=True, segment_ids=q_ids, kv_segment_ids=kv_ids, logit_soft_cap=CAP,
        sinks=sinks)(q, k, v)
    out, grads = f(q, k, v, SINKS), _sink_grads(f, q, k, v, SINKS)
    self.assertTrue(all(bool(jnp.isfinite(g).all()) for g in (out, *grads)))
    np.testing.assert_array_equal(np.asarray(out[:, T - 6:]), 0.0)

  @pytest.mark.slow  # splash interpreted over 256 tokens, forward and backward
  def test_segments_with_soft_cap_and_sinks_splash_equals_dense(self):
    t = 256
    ids = jnp.asarray(np.stack([np.repeat([0, 1, 2], [70, 130, 56]), np.arange(t) % 3]),
                      jnp.int32)
    q_ids, kv_ids = padding_ids(ids, jnp.asarray(np.arange(t) < t - 20)[None].repeat(2, 0))
    q, k, v = _qkv(b=2, t=t, h_kv=1)
    f = lambda q, k, v, sinks: splash_kernel(
        q, k, v, mask=None, scores=(), causal=True, window=None, kv_lengths=None,
        return_weights=False, segment_ids=(q_ids, kv_ids), interpret=True, block_size=128,
        logit_soft_cap=CAP, sinks=sinks)[0]
    ref = lambda q, k, v, sinks: aj.scaled_dot_product_attention(
        q, k, v, causal=True, segment_ids=q_ids, kv_segment_ids=kv_ids,
        implementation='dense', logit_soft_cap=CAP, sinks=sinks)
    out = f(q, k, v, SINKS)
    np.testing.assert_array_equal(np.asarray(out[:, t - 20:]), 0.0)  # padded queries
    chex.assert_trees_all_close(out, ref(q, k, v, SINKS), atol=1e-5)
    chex.assert_trees_all_close(_sink_grads(f, q, k, v, SINKS),
                                _sink_grads(ref, q, k, v, SINKS), atol=1e-5)


class SegmentRefusalTest(parameterized.TestCase):

  def test_segments_non_integer_ids_are_a_type_error(self):
    q, k, v = _qkv()
    with self.assertRaisesRegex(TypeError, r'segment_ids must be integer .*float32'):
      aj.scaled_dot_product_attention(q, k, v, segment_ids=jnp.zeros((1, T)))
    with self.assertRaisesRegex(TypeError, r'kv_segment_ids must be integer .*bool'):
      aj.scaled_dot_product_attention(q, k, v, segment_ids=jnp.zeros((1, T), jnp.int32),
                                      kv_segment_ids=jnp.zeros((1, T), bool))

  def test_segments_mismatched_shapes_are_value_errors(self):
    q, k, v = _qkv()
    with self.assertRaisesRegex(ValueError, r'segment_ids has shape \(1, 27\).*\(1, 28\)'):
      aj.scaled_dot_product_attention(q, k, v, segment_ids=jnp.zeros((1, T - 1), jnp.int32))
    with self.assertRaisesRegex(ValueError, r'segment_ids has shape \(28,\)'):
      aj.scaled_dot_product_attention(q, k, v, segment_ids=jnp.zeros((T,), jnp.int32))
    with self.assertRaisesRegex(ValueError, 'kv_segment_ids= was given without segment_ids='):
      aj.scaled_dot_product_attention(q, k, v, kv_segment_ids=jnp.zeros((1, T), jnp.int32))
    with self.assertRaisesRegex(ValueError, 'needs T_q == T_k, got 12 and 28'):
      aj.scaled_dot_product_attention(q[:, :12], k, v,
                                      segment_ids=jnp.zeros((1, 12), jnp.int32))

  @parameterized.parameters('tpu_flash', 'cudnn')
  def test_segments_a_kernel_that_cannot_serve_them_is_named(self, name):
    request = dispatch.Request(t_k=1024, dtype=jnp.bfloat16, head_dim=128,
                               segment_ids=True)
    found = dispatch.obstacles(name, request, backend='tpu' if name != 'cudnn' else 'gpu')
    self.assertEqual(found, ["segment_ids= (packed documents: it builds no segment mask; "
                             "'splash', 'pallas_tpu', 'pallas_gpu', 'chunked', 'dense' "
                             "serve them)"])

  def test_segments_stick_breaking_on_chunked_is_refused_with_the_reason(self):
    q, k, v = _qkv()
    with self.assertRaisesRegex(
        ValueError, r"implementation='chunked' cannot serve this call: segment_ids= with "
        r"normalization='stick_breaking' \(it serves segment ids with softmax; 'dense' "
        r"serves them\)"):
      aj.scaled_dot_product_attention(q, k, v, causal=True, normalization='stick_breaking',
                                      segment_ids=jnp.zeros((1, T), jnp.int32),
                                      implementation='chunked')

  def test_segments_auto_picks_a_kernel_that_serves_them(self):
    for t_k, expected in ((64, 'dense'), (512, 'chunked')):
      request = dispatch.Request(t_k=t_k, dtype=jnp.float32, head_dim=8, causal=True,
                                 segment_ids=True)
      self.assertEqual(dispatch.select_implementation('auto', request, backend='cpu'),
                       expected)


  def test_segments_path_blockwise_refuses_them_and_auto_takes_dense(self):
    request = dispatch.Request(t_k=512, dtype=jnp.float32, head_dim=8, causal=True,
                               scores=(HouseholderScores,), segment_ids=True)
    self.assertEqual(dispatch.obstacles('path_blockwise', request, backend='cpu'),
                     ["segment_ids= (packed documents: it builds no segment mask; "
                      "'splash', 'pallas_tpu', 'pallas_gpu', 'chunked', 'dense' "
                      "serve them)"])
    self.assertEqual(dispatch.select_implementation('auto', request, backend='cpu'), 'dense')
    without = dispatch.Request(t_k=512, dtype=jnp.float32, head_dim=8, causal=True,
                               scores=(HouseholderScores,))
    self.assertEqual(dispatch.select_implementation('auto', without, backend='cpu'),
                     'path_blockwise')

  def test_segments_with_soft_cap_and_sinks_auto_picks_a_row_serving_all(self):
    for t_k, expected in ((64, 'dense'), (512, 'chunked')):
      request = dispatch.Request(t_k=t_k, dtype=jnp.float32, head_dim=8, causal=True,
                                 segment_ids=True, soft_cap=True, sinks=True)
      self.assertEqual(dispatch.select_implementation('auto', request, backend='cpu'),
                       expected)

if __name__ == '__main__':
  absltest.main()
