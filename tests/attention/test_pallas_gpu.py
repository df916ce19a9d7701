"""Our Triton flash-attention kernel equals the dense path, in outputs and
gradients (Pallas interpret mode on CPU), and lowers for CUDA without any
T × T array."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
import pytest
from absl.testing import parameterized

import attention_jax as aj
from attention_jax.attention import pallas_blocks as pb
from attention_jax.attention.pallas_gpu import key_blocks
from attention_jax.attention.pallas_gpu import pallas_gpu_attention
from attention_jax.attention.pallas_gpu import query_blocks
from attention_jax.attention.scores import DifferenceBias
from attention_jax.attention.scores import LinearBias
from attention_jax.attention.scores import WindowBias

T, D = 100, 32  # T not a multiple of the blocks: the padding paths run
ATOL = {'float32': 1e-5, 'bfloat16': 2e-2, 'float16': 2e-2}
TRITON = [jax.export.DisabledSafetyCheck.custom_call('__gpu$xla.gpu.triton')]


def _gates(key, b, h):
  """Cumulative log forget gates `[b, T, h]`, as forgetting attention makes them."""
  gates = jax.nn.log_sigmoid(2.0 + jax.random.normal(key, (b, h, T)))
  return jnp.cumsum(jnp.swapaxes(gates, 1, 2), 1)


def _case(name):
  """-> (B, H, H_kv, blocks, pallas kwargs, dense kwargs, difference or None)."""
  slopes = tuple(float(s) for s in aj.positional.alibi_slopes(2))
  if name == 'causal':
    return 1, 2, 2, (64, 64), dict(causal=True), dict(causal=True), None
  if name == 'causal_alibi':
    return (1, 2, 2, (32, 64), dict(causal=True, alibi_slopes=slopes),
            dict(causal=True, score_bias=LinearBias(slopes)), None)
  if name == 'causal_difference':
    keys = jax.random.split(jax.random.key(7))
    return 1, 2, 2, (64, 32), dict(causal=True), dict(causal=True), (
        _gates(keys[0], 1, 2), _gates(keys[1], 1, 2))
  if name == 'causal_windows_on_ids_with_sink':
    ids = np.stack([np.arange(T), np.arange(T) // 2])  # two tokens share each id in row 1
    windows = WindowBias((0, None), (9, 20), ids, ids, sink=True)
    return (2, 2, 2, (32, 32), dict(causal=True, windows=windows),
            dict(causal=True, score_bias=windows), None)
  if name == 'window_kv_lengths':
    structure = dict(window=16, kv_lengths=jnp.array([T, 37]))
    return 2, 2, 2, (16, 32), structure, structure, None
  if name == 'gqa_causal_alibi':
    slopes = tuple(float(s) for s in aj.positional.alibi_slopes(4))
    return (1, 4, 2, (64, 64), dict(causal=True, alibi_slopes=slopes),
            dict(causal=True, score_bias=LinearBias(slopes)), None)
  raise ValueError(name)


CASES = ('causal', 'causal_alibi', 'causal_difference', 'causal_windows_on_ids_with_sink',
         'window_kv_lengths', 'gqa_causal_alibi')


def _inputs(b, h, h_kv, dtype):
  keys = jax.random.split(jax.random.key(0), 4)
  shapes = [(b, T, h, D), (b, T, h_kv, D), (b, T, h_kv, D), (b, T, h, D)]
  return [jax.random.normal(kk, s).astype(dtype) for kk, s in zip(keys, shapes)]


def _out_and_grads(f, q, k, v, dout, values):
  """f's output and the vjp of dout to q, k, v and the difference values."""
  out, vjp = jax.vjp(f, q, k, v, *values)
  return out, vjp(dout.astype(out.dtype))


def _tensor_sizes(module: str):
  """The element counts of every ranked tensor type in an MLIR module."""
  dims = re.findall(r'tensor<((?:\d+x)*)[a-z]', module)
  return [int(np.prod([int(n) for n in d.split('x')[:-1]])) for d in dims]


class PallasGpuAttentionTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      *[(f'_{c}_{d}', c, d) for c in CASES for d in ('float32', 'bfloat16')])
  @pytest.mark.slow
  def test_equals_dense_in_outputs_and_gradients(self, case, dtype):
    b, h, h_kv, blocks, kwargs, dense_kwargs, values = _case(case)
    q, k, v, dout = _inputs(b, h, h_kv, jnp.dtype(dtype))
    values = values or ()

    def pallas(q, k, v, *values):
      extra = dict(difference=DifferenceBias(*values)) if values else {}
      return pallas_gpu_attention(q, k, v, interpret=True, block_q=blocks[0],
                                  block_k=blocks[1], **kwargs, **extra)

    def dense(q, k, v, *values):
      extra = dict(score_bias=DifferenceBias(*values)) if values else {}
      return aj.attention.scaled_dot_product_attention(
          q, k, v, implementation='dense', **dense_kwargs, **extra)

    got = jax.jit(lambda *a: _out_and_grads(pallas, *a))(q, k, v, dout, values)
    # The reference runs in float32 on the same (rounded) inputs.
    want = _out_and_grads(dense, *(x.astype(jnp.float32) for x in (q, k, v, dout)), values)
    self.assertEqual(got[0].dtype, jnp.dtype(dtype))
    self.assertEqual([g.dtype for g in got[1][:3]], [jnp.dtype(dtype)] * 3)
    as_f32 = lambda tree: jax.tree.map(lambda x: x.astype(jnp.float32), tree)
    chex.assert_trees_all_close(as_f32(got), want, atol=ATOL[dtype], rtol=ATOL[dtype])

  def test_a_query_with_no_key_gets_zero_output_and_zero_gradients(self):
    q, k, v, dout = _inputs(2, 2, 2, jnp.float32)
    f = lambda q, k, v: pallas_gpu_attention(q, k, v, kv_lengths=jnp.array([0, 5]),
                                             interpret=True)
    out, (dq, dk, dv) = _out_and_grads(f, q, k, v, dout, ())
    np.testing.assert_array_equal(out[0], 0.0)
    chex.assert_tree_all_finite((out, dq, dk, dv))
    for g in (dq[0], dk[0], dv[0], dk[1, 5:], dv[1, 5:]):
      np.testing.assert_array_equal(g, 0.0)

  def test_causal_never_reads_the_blocks_above_the_diagonal(self):
    # A NaN in a key block that no query may see must not reach the output or
    # the gradients: the block is never read, not merely masked.
    q, k, v, dout = _inputs(1, 2, 2, jnp.float32)
    v = v.at[:, 32:].set(jnp.nan)
    f = lambda q, k, v: pallas_gpu_attention(q, k, v, causal=True, interpret=True,
                                             block_q=16, block_k=16)
    out, grads = _out_and_grads(f, q[:, :16], k, v, dout[:, :16], ())
    chex.assert_tree_all_finite((out, grads[0], grads[1]))
    np.testing.assert_array_equal(grads[2][:, 32:], 0.0)

  @parameterized.product(causal=(False, True), window=(None, 1, 5, 40),
                         kv_len=(0, 37, T), blocks=((16, 32), (32, 16)))
  def test_block_ranges_are_the_tiles_that_may_keep(self, causal, window, kv_len, blocks):
    bq, bk = blocks
    st = pb.Structure(scale=1.0, causal=causal, window=window, t_k=T, alibi=False,
                      difference=False, windows=False, positions=False, sink=False)
    n_q, n_k = -(-T // bq), -(-T // bk)
    may = np.array([[bool(pb.tile_may_keep(i * bq, j * bk, bq, bk, kv_len, st))
                     for j in range(n_k)] for i in range(n_q)])
    for i in range(n_q):
      lo, hi = key_blocks(i * bq, bq, bk, kv_len, st)
      np.testing.assert_array_equal(np.arange(n_k)[may[i]], np.arange(int(lo), int(hi)))
    for j in range(n_k):
      lo, hi = query_blocks(j * bk, bk, bq, n_q, kv_len, st)
      np.testing.assert_array_equal(np.arange(n_q)[may[:, j]], np.arange(int(lo), int(hi)))

  @parameterized.named_parameters(('_forward', False), ('_gradient', True))
  def test_lowers_for_cuda_without_a_t_by_t_array(self, gradient):
    t = 65536
    x = jax.ShapeDtypeStruct((1, t, 1, 64), jnp.bfloat16)
    attend = lambda q, k, v: pallas_gpu_attention(q, k, v, causal=True, alibi_slopes=(0.5,))
    f = attend if not gradient else jax.grad(
        lambda *a: jnp.sum(attend(*a).astype(jnp.float32)), argnums=(0, 1, 2))
    exported = jax.export.export(jax.jit(f), platforms=('cuda',), disabled_checks=TRITON)(
        x, x, x)
    module = exported.mlir_module()
    self.assertEqual(module.count('@__gpu$xla.gpu.triton'), 3 if gradient else 1)
    # The largest array is one [T, D] (q, k, v and their gradients): none is T × T.
    self.assertEqual(max(_tensor_sizes(module)), t * 64)

  def test_every_spec_lowers_for_cuda(self):
    # Difference, windows on ids with sink, window, lengths, GQA, D = 48.
    ids = np.stack([np.arange(300), np.arange(300) // 2])
    windows = WindowBias((0, 0, None, 0), (7, None, None, 30), ids, ids, sink=True)
    q = jax.ShapeDtypeStruct((2, 300, 4, 48), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 300, 2, 48), jnp.bfloat16)
    gates = jax.ShapeDtypeStruct((2, 300, 4), jnp.float32)
    f = lambda q, k, v, a, b: jnp.sum(pallas_gpu_attention(
        q, k, v, causal=True, window=64, kv_lengths=jnp.array([300, 100]),
        difference=DifferenceBias(a, b), windows=windows).astype(jnp.float32))
    grad = jax.grad(f, argnums=(0, 1, 2, 3, 4))
    exported = jax.export.export(jax.jit(grad), platforms=('cuda',), disabled_checks=TRITON)(
        q, k, k, gates, gates)
    self.assertEqual(exported.mlir_module().count('@__gpu$xla.gpu.triton'), 3)

  @parameterized.parameters('float32', 'bfloat16', 'float16')
  @pytest.mark.slow
  def test_soft_cap_and_sinks_equal_dense_in_outputs_and_gradients(self, dtype):
    # GQA, ALiBi, padding with an empty example (its rows: zeros, no NaN).
    q, k, v, dout = (x[:, :40] for x in _inputs(2, 4, 2, jnp.dtype(dtype)))
    slopes = tuple(float(s) for s in aj.positional.alibi_slopes(4))
    sinks, lengths = jnp.array([0.5, -1.0, 2.0, 0.0]), jnp.array([0, 29])

    def pallas(q, k, v, sinks):
      return pallas_gpu_attention(q, k, v, causal=True, kv_lengths=lengths, alibi_slopes=slopes,
                                  interpret=True, block_q=16, block_k=16, logit_soft_cap=2.0,
                                  sinks=sinks)

    def dense(q, k, v, sinks):
      return aj.attention.scaled_dot_product_attention(
          q, k, v, causal=True, kv_lengths=lengths, score_bias=LinearBias(slopes),
          implementation='dense', logit_soft_cap=2.0, sinks=sinks)

    got = jax.jit(lambda *a: _out_and_grads(pallas, *a))(q, k, v, dout, (sinks,))
    want = _out_and_grads(dense, *(x.astype(jnp.float32) for x in (q, k, v, dout)), (sinks,))
    self.assertEqual(got[0].dtype, jnp.dtype(dtype))
    as_f32 = lambda tree: jax.tree.map(lambda x: x.astype(jnp.float32), tree)
    tol = ATOL[dtype]
    chex.assert_trees_all_close(as_f32(got), want, atol=tol, rtol=tol)
    chex.assert_tree_all_finite(got)
    np.testing.assert_array_equal(got[0][0], 0.0)

  def test_soft_cap_and_sinks_lower_for_cuda(self):
    x = jax.ShapeDtypeStruct((1, 256, 4, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16)
    loss = lambda q, k, v, s: jnp.sum(pallas_gpu_attention(
        q, k, v, causal=True, logit_soft_cap=50.0, sinks=s).astype(jnp.float32))
    exported = jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))),
                                 platforms=('cuda',), disabled_checks=TRITON)(
                                     x, kv, kv, jax.ShapeDtypeStruct((4,), jnp.float32))
    module = exported.mlir_module()
    self.assertEqual(module.count('@__gpu$xla.gpu.triton'), 3)
    self.assertIn('tanh', module)

  def test_bad_input(self):
    q, k, v, _ = _inputs(1, 4, 3, jnp.float32)
    with self.assertRaisesRegex(ValueError, 'H_kv=3 key/value heads must divide H=4'):
      pallas_gpu_attention(q, k, v, interpret=True)
    q, k, v, _ = _inputs(1, 2, 2, jnp.float32)
    with self.assertRaisesRegex(ValueError, 'block_q=48; use a power of two >= 16'):
      pallas_gpu_attention(q, k, v, block_q=48, interpret=True)
    with self.assertRaisesRegex(ValueError, 'block_k=8; use a power of two >= 16'):
      pallas_gpu_attention(q, k, v, block_k=8, interpret=True)


if __name__ == '__main__':
  absltest.main()
