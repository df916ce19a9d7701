"""The TPU rows ('splash', 'tpu_flash': JAX's Pallas kernels) equal the dense
kernel, outputs and gradients, run interpreted on CPU through the whole
dispatcher; 'auto' picks them on TPU where they serve the call and falls
back where they do not; they lower for TPU."""

import contextlib
import dataclasses
import functools
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
import pytest
from absl.testing import parameterized

import attention_jax as aj
from attention_jax.attention import Request
from attention_jax.attention import dispatch
from attention_jax.attention import scaled_dot_product_attention
from attention_jax.attention import select_implementation

B, T, D = 2, 256, 64  # two key blocks of 128: the kernels skip and mask tiles
TPU_ROWS = ('splash', 'tpu_flash')


@contextlib.contextmanager
def _as_tpu(interpret=True):
  """The dispatcher sees a TPU; the TPU rows run interpreted with 128-row tiles."""
  rows = {name: dataclasses.replace(dispatch.KERNELS[name], run=functools.partial(
      dispatch.KERNELS[name].run, interpret=True, block_size=128)) for name in TPU_ROWS}
  with mock.patch.object(dispatch, 'current_backend', return_value='tpu'):
    with mock.patch.dict(dispatch.KERNELS, rows if interpret else {}):
      yield


def _inputs(h, h_kv, dtype, t=T):
  keys = jax.random.split(jax.random.key(0), 5)
  q = jax.random.normal(keys[0], (B, t, h, D))
  k, v = (jax.random.normal(kk, (B, t, h_kv, D)) for kk in keys[1:3])
  bias = jax.random.normal(keys[3], (1, h, t, t))
  dout = jax.random.normal(keys[4], (B, t, h, D))
  return [x.astype(dtype) for x in (q, k, v)], bias, dout


def _outputs_and_grads(implementation, q, k, v, bias, dout, **kw):
  """The output and the grads of <out, dout> wrt q, k, v (and the bias)."""
  def loss(q, k, v, bias):
    out = scaled_dot_product_attention(q, k, v, bias=bias, implementation=implementation,
                                       **kw)
    return jnp.sum(out.astype(jnp.float32) * dout), out
  argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
  grads, out = jax.jit(jax.grad(loss, argnums, has_aux=True))(q, k, v, bias)
  return out, grads


# name: (kernel, heads, kv heads, bias?, structure)
CASES = {
    'splash_causal': ('splash', 2, 2, False, dict(causal=True)),
    # Keys >= 77 padded and a symmetric window of 40: queries from 116 on see no key.
    'splash_window_mqa_padding': ('splash', 2, 1, False,
                                  dict(window=40, kv_lengths=jnp.array([T, 77]))),
    'splash_causal_window_gqa_empty_example': (
        'splash', 4, 2, False, dict(causal=True, window=40, kv_lengths=jnp.array([0, 77]))),
    'tpu_flash_bias': ('tpu_flash', 2, 2, True, {}),
    'tpu_flash_causal_bias_mqa_padding': (
        'tpu_flash', 2, 1, True, dict(causal=True, kv_lengths=jnp.array([0, 77]))),
    'tpu_flash_alibi_causal': ('tpu_flash', 2, 2, False, dict(
        causal=True, score_bias=aj.LinearBias(aj.positional.alibi_slopes(2)))),
}


class TPUKernelsTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*((name, *case) for name, case in CASES.items()))
  @pytest.mark.slow
  def test_equals_dense_in_outputs_and_gradients_float32(self, name, h, h_kv, with_bias,
                                                         structure):
    (q, k, v), bias, dout = _inputs(h, h_kv, jnp.float32)
    bias = bias if with_bias else None
    with _as_tpu():
      got = _outputs_and_grads(name, q, k, v, bias, dout, **structure)
    want = _outputs_and_grads('dense', q, k, v, bias, dout, **structure)
    chex.assert_trees_all_close(got, want, atol=1e-5)
    lengths = structure.get('kv_lengths')
    if lengths is not None and int(lengths[0]) == 0:  # no key at all: zeros, as dense
      np.testing.assert_array_equal(got[0][0], 0.0)
      np.testing.assert_array_equal(got[1][0][0], 0.0)

  @parameterized.named_parameters(
      ('splash', 'splash', False, dict(causal=True, window=40)),
      ('tpu_flash', 'tpu_flash', True, dict(causal=True, kv_lengths=jnp.array([T, 77]))))
  @pytest.mark.slow
  def test_equals_dense_in_bfloat16(self, name, with_bias, structure):
    # The reference: the dense kernel in float32 on the same bf16-rounded inputs.
    (q, k, v), bias, dout = _inputs(2, 1, jnp.bfloat16)
    bias = bias if with_bias else None
    with _as_tpu():
      got = _outputs_and_grads(name, q, k, v, bias, dout, **structure)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    want = _outputs_and_grads('dense', *f32, bias, dout, **structure)
    self.assertEqual(got[0].dtype, jnp.bfloat16)
    chex.assert_trees_all_close(jax.tree.map(lambda x: x.astype(jnp.float32), got), want,
                                atol=2e-2, rtol=2e-2)

  @parameterized.parameters(*TPU_ROWS)
  def test_forward_and_backward_lower_for_tpu(self, name):
    x = jax.ShapeDtypeStruct((B, T, 2, D), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((B, T, 1, D), jnp.bfloat16)
    bias = jax.ShapeDtypeStruct((T, T), jnp.float32)
    def loss(q, k, v, bias):
      return jnp.sum(scaled_dot_product_attention(
          q, k, v, bias=bias if name == 'tpu_flash' else None, causal=True,
          kv_lengths=jnp.array([T, 100]), implementation='auto').astype(jnp.float32))
    with _as_tpu(interpret=False):
      exported = jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2))),
                                   platforms=('tpu',))(x, kv, kv, bias)
    text = exported.mlir_module()
    self.assertEqual(text.count('tpu_custom_call'), 3)  # forward, dK/dV, dQ
    self.assertIn('splash_mha_fwd' if name == 'splash' else 'flash_mha_bwd_dq', text)


class SplashSoftCapAndSinksTest(chex.TestCase):

  @pytest.mark.slow
  def test_splash_soft_cap_and_sinks_equal_dense_in_outputs_and_gradients(self):
    (q, k, v), _, dout = _inputs(2, 1, jnp.float32, t=128)
    sinks = jnp.array([0.5, -1.0])
    structure = dict(causal=True, kv_lengths=jnp.array([0, 100]), logit_soft_cap=2.0)

    def outputs_and_grads(implementation):
      def loss(q, k, v, sinks):
        out = scaled_dot_product_attention(3.0 * q, k, v, implementation=implementation,
                                           sinks=sinks, **structure)
        return jnp.sum(out * dout[:, :128]), out
      grads, out = jax.jit(jax.grad(loss, (0, 1, 2, 3), has_aux=True))(q, k, v, sinks)
      return out, grads

    with _as_tpu():
      got = outputs_and_grads('splash')
    chex.assert_trees_all_close(got, outputs_and_grads('dense'), atol=1e-5)
    chex.assert_trees_all_equal(got[0][0], jnp.zeros_like(got[0][0]))

  def test_splash_soft_cap_and_sinks_lower_for_tpu(self):
    x = jax.ShapeDtypeStruct((B, T, 2, D), jnp.bfloat16)
    def loss(q, k, v, sinks):
      return jnp.sum(scaled_dot_product_attention(
          q, k, v, causal=True, implementation='splash', logit_soft_cap=50.0,
          sinks=sinks).astype(jnp.float32))
    with _as_tpu(interpret=False):
      exported = jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))),
                                   platforms=('tpu',))(
                                       x, x, x, jax.ShapeDtypeStruct((2,), jnp.float32))
    self.assertEqual(exported.mlir_module().count('tpu_custom_call'), 3)


def _select(requested, backend='tpu', **kw):
  call = dict(t_k=T, dtype=jnp.bfloat16, head_dim=D, causal=True)
  return select_implementation(requested, Request(**dict(call, **kw)), backend)


class TPUSelectionTest(parameterized.TestCase):

  def test_auto_picks_splash_for_structure_only(self):
    self.assertEqual(_select('auto'), 'splash')
    self.assertEqual(_select('auto', dtype=jnp.float32, window=64, kv_lengths=True,
                             gqa=True, v_head_dim=32), 'splash')
    self.assertEqual(_select('auto', causal=False, window=64), 'splash')
    self.assertEqual(_select('auto', t_q=128, t_k=384, causal=False), 'splash')

  def test_auto_picks_tpu_flash_for_a_dense_bias(self):
    bias = (aj.DenseBias,)
    self.assertEqual(_select('auto', scores=bias), 'tpu_flash')
    self.assertEqual(_select('auto', scores=bias, head_dim=256), 'tpu_flash')
    self.assertEqual(_select('auto', scores=bias, head_dim=192), 'dense')
    self.assertEqual(_select('auto', scores=bias, window=64), 'dense')
    self.assertEqual(_select('auto', scores=bias, v_head_dim=32), 'dense')
    # ALiBi, forgetting gates, windows: our kernel builds them in the kernel.
    self.assertEqual(_select('auto', scores=(aj.LinearBias,), t_k=4096), 'pallas_tpu')
    self.assertEqual(_select('auto', scores=(aj.DifferenceBias,), t_k=100), 'pallas_tpu')
    self.assertEqual(_select('auto', scores=(aj.WindowBias,), t_k=128), 'pallas_tpu')

  def test_auto_falls_back_where_they_cannot_serve(self):
    self.assertEqual(_select('auto', t_k=1000), 'pallas_tpu')  # not a multiple of 128
    self.assertEqual(_select('auto', t_k=200), 'pallas_tpu')
    self.assertEqual(_select('auto', dtype=jnp.float16, t_k=4096), 'chunked')
    self.assertEqual(_select('auto', return_weights=True), 'dense')
    self.assertEqual(_select('auto', dense_mask=True), 'dense')
    self.assertEqual(_select('auto', normalization='stick_breaking'), 'chunked')
    self.assertEqual(_select('auto', backend='cpu'), 'chunked')

  def test_naming_them_lists_every_obstacle(self):
    with self.assertRaisesRegex(ValueError, r"'splash' cannot serve this call: a dense bias "
                                r"\[DenseBias: 'cudnn', 'tpu_flash', 'dense' take it\]; a TPU "
                                r"\(the default backend is 'cpu'\); T_q and T_k "
                                r'multiples of 128 \(got T_q=200, T_k=200\)'):
      select_implementation('splash', Request(
          t_k=200, dtype=jnp.float32, head_dim=D, scores=(aj.DenseBias,)))
    with self.assertRaisesRegex(ValueError, r"'tpu_flash' cannot serve this call: a dense "
                                r'mask .*; float32 or bfloat16 inputs \(got float16\); head_dim '
                                r'up to 128 or a multiple of 128 \(got 192\); D_v == D \(got '
                                r'D=192, D_v=64\); window=8 \(it serves no sliding window\)'):
      _select('tpu_flash', dense_mask=True, dtype=jnp.float16, head_dim=192, v_head_dim=64,
              window=8)
    q = jnp.ones((1, T, 2, D))
    with self.assertRaisesRegex(ValueError, r"'splash' cannot serve this call: a TPU"):
      scaled_dot_product_attention(q, q, q, causal=True, implementation='splash')


if __name__ == '__main__':
  absltest.main()
