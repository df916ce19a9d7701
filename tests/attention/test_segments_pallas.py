"""Segment ids in the kernels built for accelerators, run here in interpret
mode or lowered with `jax.export`: our Pallas kernels build the segment mask
per tile, JAX's splash kernel takes the ids as its `SegmentIds`, and a
kernel run per device splits the ids with the batch. Shared inputs and
checks: test_segments.py."""

import re
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from jax.experimental.pallas import tpu as pltpu

import attention_jax as aj
from attention_jax.attention import dispatch
from attention_jax.attention.pallas_gpu import pallas_gpu_attention
from attention_jax.attention.pallas_tpu import pallas_tpu_attention
from attention_jax.attention.segments import padding_ids
from attention_jax.attention.splash import splash_kernel
from tests import tiers
from tests.attention.test_segments import ATOL, D, T
from tests.attention.test_segments import _assert_packed_equals_alone
from tests.attention.test_segments import _attend
from tests.attention.test_segments import _grads
from tests.attention.test_segments import _ids
from tests.attention.test_segments import _pallas
from tests.attention.test_segments import _qkv


LOWERED_T = 16384  # long enough that a T x T array would dwarf every other tensor


def _lowered_gradient(kernel, head_dim: int, platform: str, **export_options) -> str:
  """The MLIR of the q, k, v gradient of `kernel` with segment ids, causal,
  bfloat16 `[1, LOWERED_T, 1, head_dim]`, exported for `platform`."""
  x = jax.ShapeDtypeStruct((1, LOWERED_T, 1, head_dim), jnp.bfloat16)
  ids = jax.ShapeDtypeStruct((1, LOWERED_T), jnp.int32)
  loss = lambda q, k, v, ids: jnp.sum(kernel(
      q, k, v, causal=True, segment_ids=(ids, ids)).astype(jnp.float32))
  return jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=(platform,),
                           **export_options)(x, x, x, ids).mlir_module()


class PallasSegmentsTest(chex.TestCase, parameterized.TestCase):
  """Our Pallas kernels build the segment mask per tile (interpret mode)."""

  @parameterized.product(causal=(True, False), name=('pallas_gpu', 'pallas_tpu'))
  @tiers.fast_cases(2)  # each kernel, causal
  def test_segments_pallas_packed_row_equals_each_document_alone(self, name, causal):
    q, k, v = _qkv(h_kv=1)
    _assert_packed_equals_alone(_pallas(name, causal=causal, segment_ids=(_ids()[None],) * 2),
                                _attend('dense', causal=causal), q, k, v)

  @parameterized.parameters(('pallas_gpu', 'float16'), ('pallas_gpu', 'bfloat16'),
                            ('pallas_tpu', 'bfloat16'))
  @tiers.fast_cases(1)
  def test_segments_pallas_padding_and_interleaved_ids_in_half_precision(self, name, dtype):
    ids = jnp.asarray(np.stack([_ids(), np.arange(T) % 3]), jnp.int32)
    q_ids, kv_ids = padding_ids(ids, jnp.asarray(np.arange(T) < T - 4)[None].repeat(2, 0))
    q, k, v = _qkv(b=2, dtype=jnp.dtype(dtype))
    f = _pallas(name, causal=True, segment_ids=(q_ids, kv_ids))
    ref = _attend('dense', causal=True, mask=aj.segment_mask(q_ids, kv_ids))
    out, grads = f(q, k, v), _grads(f, q, k, v)
    self.assertTrue(all(bool(jnp.isfinite(g).all()) for g in (out, *grads)))
    np.testing.assert_array_equal(np.asarray(out[:, T - 4:], np.float32), 0.0)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    chex.assert_trees_all_close(out.astype(jnp.float32), ref(*f32), atol=ATOL[dtype])
    chex.assert_trees_all_close([g.astype(jnp.float32) for g in grads],
                                list(_grads(ref, *f32)), atol=5 * ATOL[dtype])

  def test_segments_auto_on_a_tpu_takes_pallas_tpu_below_splash_lengths(self):
    q, k, v = _qkv()
    ids = jnp.asarray(_ids()[None])
    with mock.patch.object(dispatch, 'current_backend', lambda: 'tpu'):
      request = dispatch.Request(t_k=T, dtype=q.dtype, head_dim=D, causal=True,
                                 segment_ids=True)
      self.assertEqual(dispatch.select_implementation('auto', request), 'pallas_tpu')
      with pltpu.force_tpu_interpret_mode():
        got = aj.scaled_dot_product_attention(q, k, v, causal=True, segment_ids=ids)
    chex.assert_trees_all_close(got, _attend('dense', causal=True, segment_ids=ids)(q, k, v),
                                atol=1e-5)

  def test_segments_pallas_gpu_lowers_for_cuda_without_a_t_by_t_array(self):
    module = _lowered_gradient(pallas_gpu_attention, 64, 'cuda', disabled_checks=[
        jax.export.DisabledSafetyCheck.custom_call('__gpu$xla.gpu.triton')])
    self.assertEqual(module.count('@__gpu$xla.gpu.triton'), 3)
    self.assertEqual(max(_tensor_sizes(module)), LOWERED_T * 64)

  def test_segments_pallas_tpu_lowers_for_tpu_without_a_t_by_t_array(self):
    module = _lowered_gradient(pallas_tpu_attention, 128, 'tpu')
    self.assertEqual(module.count('tpu_custom_call'), 3)
    self.assertLessEqual(max(_tensor_sizes(module)), LOWERED_T * 128)

class SplashSegmentsTest(chex.TestCase):
  """JAX's splash kernel takes the ids as its `SegmentIds` (interpreted)."""

  def test_segments_splash_with_padding_window_and_lengths_equals_dense(self):
    t = 256
    ids = jnp.asarray(np.stack([np.repeat([0, 1, 2], [70, 130, 56]), np.arange(t) % 3]),
                      jnp.int32)
    q_ids, kv_ids = padding_ids(ids, jnp.asarray(np.arange(t) < t - 20)[None].repeat(2, 0))
    call = dict(causal=True, window=100, kv_lengths=jnp.array([t, 150]))
    q, k, v = _qkv(b=2, t=t, h_kv=1)
    f = lambda q, k, v: splash_kernel(
        q, k, v, mask=None, scores=(), return_weights=False, segment_ids=(q_ids, kv_ids),
        interpret=True, block_size=128, **call)[0]
    ref = _attend('dense', mask=aj.segment_mask(q_ids, kv_ids), **call)
    out = f(q, k, v)
    np.testing.assert_array_equal(np.asarray(out[:, t - 20:]), 0.0)  # padded queries
    chex.assert_trees_all_close(out, ref(q, k, v), atol=1e-5)
    chex.assert_trees_all_close(_grads(f, q, k, v), _grads(ref, q, k, v), atol=1e-5)


class PerDeviceSegmentsTest(parameterized.TestCase):

  def test_segments_split_with_the_batch_when_a_pallas_kernel_runs_per_device(self):
    # Under a mesh of 2 a Pallas kernel runs once per device on its half of
    # the batch (partition.py): the ids must be split with q, k and v.
    mesh = jax.sharding.AbstractMesh((2,), ('data',),
                                     axis_types=(jax.sharding.AxisType.Auto,))
    x = jax.ShapeDtypeStruct((4, 256, 2, 128), jnp.bfloat16)
    ids = jax.ShapeDtypeStruct((4, 256), jnp.int32)
    f = lambda q, k, v, ids: aj.scaled_dot_product_attention(
        q, k, v, causal=True, segment_ids=ids, implementation='pallas_tpu')
    with mock.patch.object(dispatch, 'current_backend', lambda: 'tpu'), \
        jax.sharding.use_abstract_mesh(mesh):
      exported = jax.export.export(jax.jit(f), platforms=('tpu',))(x, x, x, ids)
    module = exported.mlir_module()
    self.assertIn('tpu_custom_call', module)
    # Inside the per-device program, the ids are [B / 2, T].
    self.assertIn('tensor<2x256xi32>', module)


def _tensor_sizes(module: str):
  """The element counts of every ranked tensor type in an MLIR module."""
  dims = re.findall(r'tensor<((?:\d+x)+)\w+>', module)
  return [int(np.prod([int(n) for n in d.rstrip('x').split('x')])) for d in dims]


if __name__ == '__main__':
  absltest.main()
