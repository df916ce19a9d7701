"""Logit soft-capping (Gemma 2) and learned sink logits (gpt-oss): the dense
kernel against the published formulas, the chunked kernel against the dense
one in outputs and gradients (the sink logits' too), the dispatcher's
refusals, and bad arguments."""

import os
import subprocess
import sys
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
import pytest

import attention_jax as aj
from attention_jax.attention import Request
from attention_jax.attention import select_implementation
from attention_jax.attention.chunked import chunked_attention
from tests import tiers

B, T, H, D = 2, 37, 4, 8  # T not a multiple of the chunks: padding paths run
SINKS = jnp.array([0.5, -1.0, 2.0, 0.0])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAP = 2.0  # small against the scores below, so the cap bends them
FEATURES = ((CAP, False), (None, True), (CAP, True))  # (logit_soft_cap, sinks on)


def _qkv(dtype=jnp.float32, h_kv=H):
  keys = jax.random.split(jax.random.key(0), 3)
  q = 3.0 * jax.random.normal(keys[0], (B, T, H, D))
  k = 3.0 * jax.random.normal(keys[1], (B, T, h_kv, D))
  v = jax.random.normal(keys[2], (B, T, h_kv, D))
  return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def _published(q, k, v, *, cap, sinks, mask):
  """Gemma 2's cap (c · tanh(s / c), then the mask) and gpt-oss's `sdpa`
  (the sink logit concatenated as one more column of the softmax, then
  dropped), written out on `[B, H, T_q, T_k]` with -inf masking."""
  group = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, group, 2), jnp.repeat(v, group, 2)
  s = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32) / D ** 0.5
  if cap is not None:
    s = cap * jnp.tanh(s / cap)
  s = jnp.where(mask, s, -jnp.inf)
  if sinks is not None:
    column = jnp.broadcast_to(sinks[None, :, None, None], (*s.shape[:3], 1))
    w = jax.nn.softmax(jnp.concatenate([s, column], -1), -1)[..., :-1]
  else:
    w = jax.nn.softmax(s, -1)
  return jnp.einsum('bhqk,bkhd->bqhd', w, v.astype(jnp.float32))


def _loss(f):
  return lambda *a: jnp.sum(jnp.sin(f(*a)))


class DenseTest(chex.TestCase, parameterized.TestCase):

  @parameterized.product(features=FEATURES, h_kv=(H, 2))
  def test_dense_equals_the_published_formulas(self, features, h_kv):
    cap, sinks = features
    q, k, v = _qkv(h_kv=h_kv)
    s = SINKS if sinks else None
    out = aj.scaled_dot_product_attention(q, k, v, causal=True, implementation='dense',
                                          logit_soft_cap=cap, sinks=s)
    ref = _published(q, k, v, cap=cap, sinks=s, mask=jnp.tril(jnp.ones((T, T), bool)))
    chex.assert_trees_all_close(out, ref, atol=1e-5)

  def test_dense_sink_gradient_equals_the_published_formula(self):
    q, k, v = _qkv()
    mask = jnp.tril(jnp.ones((T, T), bool))
    ours = jax.grad(_loss(lambda s: aj.scaled_dot_product_attention(
        q, k, v, causal=True, implementation='dense', sinks=s)))(SINKS)
    ref = jax.grad(_loss(lambda s: _published(q, k, v, cap=None, sinks=s, mask=mask)))(SINKS)
    chex.assert_trees_all_close(ours, ref, atol=1e-5)
    self.assertTrue(np.all(np.abs(np.asarray(ours)) > 0))

  def test_weights_of_a_sink_sum_below_one(self):
    q, k, v = _qkv()
    _, w = aj.scaled_dot_product_attention(q / 3, k / 3, v, causal=True, sinks=SINKS,
                                           return_weights=True)
    sums = np.asarray(w.sum(-1))  # [B, H, T]
    self.assertTrue(np.all(sums < 1.0) and np.all(sums > 0.0))

  def test_the_cap_bounds_the_scores_and_bias(self):
    # Scores plus a large bias: capped, no weight can exceed softmax of ±c.
    q, k, v = _qkv()
    bias = jnp.where(jnp.eye(T, dtype=bool), 1e4, 0.0)
    _, w = aj.scaled_dot_product_attention(q, k, v, bias=bias, logit_soft_cap=CAP,
                                           return_weights=True)
    bound = np.exp(CAP) / (np.exp(CAP) + (T - 1) * np.exp(-CAP))
    self.assertLessEqual(float(w.max()), bound + 1e-6)


class ChunkedTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(with_jit=True)
  @parameterized.product(strategy=('scan', 'unrolled'), features=FEATURES, h_kv=(H, 2))
  @tiers.fast_cases(6)  # the scan, every feature and head layout
  def test_chunked_equals_dense_in_outputs_and_gradients(self, strategy, features, h_kv):
    cap, sinks = features
    q, k, v = _qkv(h_kv=h_kv)
    lengths, slopes = jnp.array([T, 20]), aj.positional.alibi_slopes(H)
    chunked = lambda q, k, v, s: chunked_attention(
        q, k, v, causal=True, kv_lengths=lengths, alibi_slopes=slopes, strategy=strategy,
        q_chunk=8, k_chunk=16, logit_soft_cap=cap, sinks=s if sinks else None)
    dense = lambda q, k, v, s: aj.scaled_dot_product_attention(
        q, k, v, causal=True, kv_lengths=lengths, score_bias=aj.LinearBias(slopes),
        implementation='dense', logit_soft_cap=cap, sinks=s if sinks else None)
    chex.assert_trees_all_close(self.variant(chunked)(q, k, v, SINKS),
                                dense(q, k, v, SINKS), atol=1e-5)
    grads = self.variant(jax.grad(_loss(chunked), argnums=(0, 1, 2, 3)))(q, k, v, SINKS)
    chex.assert_trees_all_close(grads, jax.grad(_loss(dense), argnums=(0, 1, 2, 3))(
        q, k, v, SINKS), atol=1e-5)

  @parameterized.parameters('scan', 'unrolled')
  def test_chunked_difference_bias_is_capped_with_its_gradients(self, strategy):
    q, k, v = _qkv()
    keys = jax.random.split(jax.random.key(1), 2)
    qv, kv = (3.0 * jax.random.normal(x, (B, T, H)) for x in keys)
    run = lambda impl: lambda qv, kv: aj.scaled_dot_product_attention(
        q, k, v, causal=True, score_bias=aj.DifferenceBias(qv, kv), implementation=impl,
        chunk_size=16, chunked_strategy=strategy, logit_soft_cap=CAP, sinks=SINKS)
    chex.assert_trees_all_close(run('chunked')(qv, kv), run('dense')(qv, kv), atol=1e-5)
    chex.assert_trees_all_close(jax.grad(_loss(run('chunked')), (0, 1))(qv, kv),
                                jax.grad(_loss(run('dense')), (0, 1))(qv, kv), atol=1e-5)

  @parameterized.product(impl=('dense', 'chunked'), strategy=('scan', 'unrolled'))
  def test_a_fully_masked_row_with_sinks_gives_zero_and_no_nan(self, impl, strategy):
    q, k, v = _qkv()
    lengths = jnp.array([T, 0])  # example 1: no key at all
    f = lambda q, k, v, s: aj.scaled_dot_product_attention(
        q, k, v, kv_lengths=lengths, implementation=impl, chunk_size=16,
        chunked_strategy=strategy, sinks=s, logit_soft_cap=CAP)
    out = f(q, k, v, SINKS)
    chex.assert_trees_all_equal(out[1], jnp.zeros_like(out[1]))
    grads = jax.grad(_loss(f), argnums=(0, 1, 2, 3))(q, k, v, SINKS)
    chex.assert_tree_all_finite(grads)
    chex.assert_trees_all_equal(grads[0][1], jnp.zeros_like(grads[0][1]))

  @parameterized.product(dtype=(jnp.float32, jnp.bfloat16, jnp.float16),
                         impl=('dense', 'chunked'))
  def test_every_dtype_softmax_in_float32(self, dtype, impl):
    q, k, v = _qkv(dtype)
    out = aj.scaled_dot_product_attention(q, k, v, causal=True, implementation=impl,
                                          chunk_size=16, logit_soft_cap=CAP, sinks=SINKS)
    self.assertEqual(out.dtype, dtype)
    ref = _published(q, k, v, cap=CAP, sinks=SINKS, mask=jnp.tril(jnp.ones((T, T), bool)))
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    chex.assert_trees_all_close(out.astype(jnp.float32), ref, atol=tol, rtol=tol)


class DispatchTest(parameterized.TestCase):

  def _select(self, requested, backend='cpu', **kw):
    return select_implementation(requested, Request(t_k=512, dtype=jnp.bfloat16,
                                                    head_dim=64, **kw), backend)

  def test_auto_skips_rows_that_cannot(self):
    self.assertEqual(self._select('auto', backend='gpu'), 'cudnn')
    self.assertEqual(self._select('auto', backend='gpu', soft_cap=True), 'pallas_gpu')
    self.assertEqual(self._select('auto', backend='gpu', sinks=True), 'pallas_gpu')
    self.assertEqual(self._select('auto', backend='tpu', sinks=True, soft_cap=True), 'splash')
    self.assertEqual(self._select('auto', soft_cap=True, sinks=True), 'chunked')

  @parameterized.parameters('cudnn', 'tpu_flash')
  def test_rows_without_them_are_refused_with_the_reason(self, name):
    with self.assertRaisesRegex(ValueError, rf"'{name}' cannot serve this call: .*"
                                r"logit_soft_cap= \(it does not cap the scores; 'splash', "
                                r"'pallas_tpu', 'pallas_gpu', 'chunked', 'dense' serve it\); "
                                r"sinks= \(its softmax has no learned sink logit; "):
      self._select(name, soft_cap=True, sinks=True)

  def test_stick_breaking_is_refused_with_the_reason(self):
    q = jnp.ones((1, 4, 2, 8))
    for kw in (dict(logit_soft_cap=CAP), dict(sinks=jnp.zeros(2))):
      with self.assertRaisesRegex(ValueError,
                                  'act on a softmax, not on stick-breaking: its remainder'):
        aj.scaled_dot_product_attention(q, q, q, causal=True, normalization='stick_breaking',
                                        **kw)


class MeshTest(absltest.TestCase):

  @pytest.mark.slow
  def test_sink_gradient_of_a_kernel_run_per_device(self):
    """On 2 (fake CPU) devices, a row that XLA cannot partition runs per
    device (`partition.py`); the sink logits' gradient, summed over the
    devices, equals the one-device gradient."""
    script = textwrap.dedent('''
        import dataclasses
        from unittest import mock
        import jax, jax.numpy as jnp, numpy as np
        from attention_jax.attention import dispatch, partition, scaled_dot_product_attention
        assert jax.device_count() == 2
        q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 8, 2, 4))
        loss = lambda s: jnp.sum(jnp.sin(scaled_dot_product_attention(
            q, k, v, causal=True, implementation='dense', logit_soft_cap=2.0, sinks=s)))
        s = jnp.array([0.5, -1.0])
        want, calls = jax.grad(loss)(s), []
        row = dataclasses.replace(dispatch.KERNELS['dense'], partitionable=False)
        spy = lambda *a, **kw: calls.append(1) or partition.per_device(*a, **kw)
        mesh = jax.make_mesh((2,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
        with mock.patch.dict(dispatch.KERNELS, {'dense': row}), \\
            mock.patch.object(dispatch, 'per_device', spy), jax.set_mesh(mesh):
          got = jax.jit(jax.grad(loss))(s)
        print('CALLS', len(calls), 'MAXDIFF', float(np.max(np.abs(got - want))))
        ''')
    env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=2',
               JAX_PLATFORMS='cpu', PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, '-c', script], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    self.assertEqual(out.stdout.split('CALLS')[1].split()[0], '1')
    self.assertLessEqual(float(out.stdout.split('MAXDIFF')[1].split()[0]), 1e-6)


class ArgumentTest(parameterized.TestCase):

  @parameterized.parameters(0, 0.0, -1.0, float('nan'), float('inf'))
  def test_a_cap_must_be_positive_and_finite(self, cap):
    q = jnp.ones((1, 4, 2, 8))
    with self.assertRaisesRegex(ValueError, rf'logit_soft_cap={cap!r}: use a positive finite'):
      aj.scaled_dot_product_attention(q, q, q, logit_soft_cap=cap)

  @parameterized.parameters(('50',), (True,), ([50.0],), (jnp.array(3.0),))
  def test_a_cap_must_be_a_number(self, cap):
    q = jnp.ones((1, 4, 2, 8))
    with self.assertRaisesRegex(TypeError, 'logit_soft_cap=.*: use a positive finite number'):
      aj.scaled_dot_product_attention(q, q, q, logit_soft_cap=cap)

  def test_numpy_and_int_caps_are_numbers(self):
    q, k, v = _qkv()
    ref = aj.scaled_dot_product_attention(q, k, v, logit_soft_cap=2.0)
    for cap in (2, np.float32(2.0)):
      chex.assert_trees_all_close(aj.scaled_dot_product_attention(q, k, v, logit_soft_cap=cap),
                                  ref)

  @parameterized.parameters(((2,),), ((1, 4),), ((4, 1),), ((),))
  def test_sinks_must_be_one_per_query_head(self, shape):
    q = jnp.ones((1, 4, 4, 8))
    with self.assertRaisesRegex(ValueError, rf'sinks has shape {re_shape(shape)}: give \[H\] '
                                r'= \(4,\)'):
      aj.scaled_dot_product_attention(q, q, q, sinks=jnp.zeros(shape))

  def test_sinks_must_be_floats(self):
    q = jnp.ones((1, 4, 4, 8))
    with self.assertRaisesRegex(TypeError, 'sinks must be a float array'):
      aj.scaled_dot_product_attention(q, q, q, sinks=jnp.zeros(4, jnp.int32))
    with self.assertRaisesRegex(TypeError, 'sinks must be a float array .*got list'):
      aj.scaled_dot_product_attention(q, q, q, sinks=[0.0] * 4)


def re_shape(shape):
  return '\\' + repr(tuple(shape)).replace(')', '\\)')


if __name__ == '__main__':
  absltest.main()
