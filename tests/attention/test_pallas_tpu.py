"""Our TPU Pallas kernel (`pallas_tpu.py`) equals the dense kernel in TPU
interpret mode, outputs and gradients, with every bias built in the kernel;
and it lowers for TPU at T = 65,536 without a T × T array."""

import re
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
import pytest
from absl.testing import parameterized
from jax.experimental.pallas import tpu as pltpu

import attention_jax as aj
from attention_jax.attention import dispatch
from attention_jax.attention.pallas_tpu import pallas_tpu_attention
from attention_jax.attention.scores import DifferenceBias
from attention_jax.attention.scores import LinearBias
from attention_jax.attention.scores import WindowBias
from attention_jax.positional.windowed_rope import WindowedRoPE

T = 136  # two blocks of 128, the second mostly padding
D = 32


def _inputs(b, h, h_kv, dtype):
  keys = jax.random.split(jax.random.key(1), 6)
  q = jax.random.normal(keys[0], (b, T, h, D))
  k, v = (jax.random.normal(kk, (b, T, h_kv, D)) for kk in keys[1:3])
  qv, kv = (jnp.swapaxes(jax.random.normal(kk, (b, h, T)), 1, 2) for kk in keys[3:5])
  dout = jax.random.normal(keys[5], (b, T, h, D))
  return [x.astype(dtype) for x in (q, k, v)], (qv, kv), dout


# name: (batch, heads, kv heads, score spec builder, structure). Every query
# keeps a visible key inside its windows: where none is left, the kernel
# gives zeros and the dense kernel's MASK_VALUE bias an arbitrary average
# (pallas_blocks.py).
COUPLED_IDS = np.stack([np.arange(T) // 2])  # each id used by two tokens, as under coupling
CASES = {
    'causal_alibi_gqa': (1, 2, 1, lambda qv, kv: LinearBias((0.5, 0.125)), dict(causal=True)),
    'causal_difference': (1, 2, 2, DifferenceBias, dict(causal=True)),
    'causal_windows_on_ids_with_sink': (
        1, 2, 2, lambda qv, kv: WindowBias((-2, None), (2, None), COUPLED_IDS, COUPLED_IDS,
                                           sink=True), dict(causal=True)),
    'window_padding_windows_on_indices': (
        2, 2, 2, lambda qv, kv: WindowBias((0, -5), (8, 6)),
        dict(causal=False, window=40, kv_lengths=jnp.array([0, 130]))),
}


def _pallas(score, **structure):
  spec = dict(alibi_slopes=score.slopes if isinstance(score, LinearBias) else None,
              difference=score if isinstance(score, DifferenceBias) else None,
              windows=score if isinstance(score, WindowBias) else None)
  return lambda q, k, v: pallas_tpu_attention(q, k, v, interpret=True, **spec, **structure)


def _dense(score, **structure):
  return lambda q, k, v: aj.attention.scaled_dot_product_attention(
      q, k, v, score_bias=score, implementation='dense', **structure)


def _outputs_and_grads(f, q, k, v, values, dout, spec):
  """f's output and the grads of <f, dout> wrt q, k, v and the difference values."""
  def loss(q, k, v, qv, kv):
    out = f(spec(qv, kv))(q, k, v)
    return jnp.sum(out.astype(jnp.float32) * dout), out
  grads, out = jax.grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)(q, k, v, *values)
  return out, grads


class PallasTPUTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*((name, *case) for name, case in CASES.items()))
  @pytest.mark.slow
  def test_equals_dense_in_outputs_and_gradients_float32(self, b, h, h_kv, spec, structure):
    (q, k, v), values, dout = _inputs(b, h, h_kv, jnp.float32)
    got = _outputs_and_grads(lambda s: _pallas(s, **structure), q, k, v, values, dout, spec)
    want = _outputs_and_grads(lambda s: _dense(s, **structure), q, k, v, values, dout, spec)
    chex.assert_trees_all_close(got, want, atol=1e-5)
    self.assertTrue(all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(got)))
    if 'kv_lengths' in structure:  # example 0 has no key: zeros, no NaN
      out, grads = got
      chex.assert_trees_all_equal(out[0], jnp.zeros_like(out[0]))
      chex.assert_trees_all_equal(grads[0][0], jnp.zeros_like(grads[0][0]))

  def test_equals_dense_in_bfloat16(self):
    # The reference: the dense kernel in float32 on the same bf16-rounded inputs.
    (q, k, v), values, dout = _inputs(1, 2, 1, jnp.bfloat16)
    spec, structure = CASES['causal_alibi_gqa'][3:]
    got = _outputs_and_grads(lambda s: _pallas(s, **structure), q, k, v, values, dout, spec)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    want = _outputs_and_grads(lambda s: _dense(s, **structure), *f32, values, dout, spec)
    self.assertEqual(got[0].dtype, jnp.bfloat16)
    chex.assert_trees_all_close(jax.tree.map(lambda x: x.astype(jnp.float32), got), want,
                                atol=5e-2, rtol=2e-2)

  def test_auto_runs_it_on_tpu_for_alibi_and_it_equals_dense(self):
    (q, k, v), _, _ = _inputs(1, 2, 2, jnp.float32)
    spec = LinearBias((0.5, 0.125))
    with mock.patch.object(dispatch, 'current_backend', lambda: 'tpu'):
      request = dispatch.Request(t_k=T, dtype=q.dtype, head_dim=D, scores=(spec,),
                                 causal=True)
      self.assertEqual(dispatch.select_implementation('auto', request), 'pallas_tpu')
      with pltpu.force_tpu_interpret_mode():
        got = aj.attention.scaled_dot_product_attention(q, k, v, causal=True,
                                                        score_bias=spec)
    chex.assert_trees_all_close(got, _dense(spec, causal=True)(q, k, v), atol=1e-5)

  def test_alibi_forward_and_backward_lower_for_tpu_at_65536_without_a_t_by_t_array(self):
    t = 65536
    x = jax.ShapeDtypeStruct((1, t, 1, 64), jnp.bfloat16)
    loss = lambda q, k, v: jnp.sum(pallas_tpu_attention(
        q, k, v, causal=True, alibi_slopes=(0.5,)).astype(jnp.float32))
    exported = jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2))),
                                 platforms=('tpu',))(x, x, x)
    text = exported.mlir_module()
    self.assertIn('tpu_custom_call', text)
    sizes = [int(np.prod([int(n) for n in dims.rstrip('x').split('x')]))
             for dims in re.findall(r'tensor<((?:\d+x)+)\w+>', text)]
    self.assertLess(max(sizes), t * 128)  # O(T · D): the largest are q, k, v themselves


class SoftCapAndSinksTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters(('float32', 1e-5), ('bfloat16', 5e-2))
  @pytest.mark.slow
  def test_soft_cap_and_sinks_equal_dense_in_outputs_and_gradients(self, dtype, tol):
    # GQA, ALiBi, padding with an empty example (its rows: zeros, no NaN);
    # the reference: dense in float32 on the same (rounded) inputs.
    (q, k, v), _, dout = _inputs(2, 2, 1, jnp.dtype(dtype))
    sinks, lengths = jnp.array([0.5, -1.0]), jnp.array([0, 130])
    structure = dict(causal=True, kv_lengths=lengths, logit_soft_cap=2.0)

    def outputs_and_grads(f):
      def loss(q, k, v, sinks):
        out = f(3 * q, k, v, sinks)  # large scores, which the cap bends
        return jnp.sum(out.astype(jnp.float32) * dout), out
      grads, out = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(q, k, v, sinks)
      return out, grads

    got = outputs_and_grads(lambda q, k, v, s: pallas_tpu_attention(
        q, k, v, interpret=True, alibi_slopes=(0.5, 0.125), sinks=s, **structure))
    want = outputs_and_grads(lambda q, k, v, s: aj.attention.scaled_dot_product_attention(
        q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
        implementation='dense', score_bias=LinearBias((0.5, 0.125)), sinks=s, **structure))
    self.assertEqual(got[0].dtype, jnp.dtype(dtype))
    as_f32 = lambda tree: jax.tree.map(lambda x: x.astype(jnp.float32), tree)
    chex.assert_trees_all_close(as_f32(got), as_f32(want), atol=tol, rtol=tol)
    chex.assert_tree_all_finite(got)
    chex.assert_trees_all_equal(got[0][0], jnp.zeros_like(got[0][0]))

  def test_soft_cap_and_sinks_lower_for_tpu(self):
    x = jax.ShapeDtypeStruct((1, 256, 4, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16)
    loss = lambda q, k, v, s: jnp.sum(pallas_tpu_attention(
        q, k, v, causal=True, logit_soft_cap=50.0, sinks=s).astype(jnp.float32))
    exported = jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))),
                                 platforms=('tpu',))(
                                     x, kv, kv, jax.ShapeDtypeStruct((4,), jnp.float32))
    self.assertEqual(exported.mlir_module().count('tpu_custom_call'), 3)


def _spec(enc, p):
  """What a position-only encoding adds at positions p, as a module asks it."""
  q = jnp.zeros((1, p.shape[-1], 1, 1))
  return enc.score_contribution(aj.ScoreContext(q=q, k=q, q_positions=p, k_positions=p))


class WindowBiasTest(chex.TestCase, parameterized.TestCase):

  @parameterized.product(causal=(True, False), batched=(False, True))
  def test_hard_alibi_windows_equal_its_dense_bias_bit_for_bit(self, causal, batched):
    enc = aj.positional.HardALiBi(4, (1, 3), causal)
    p = np.stack([np.arange(12), np.arange(12) % 5]) if batched else np.arange(12)
    dense = jnp.asarray(enc.attention_bias(p, p))
    chex.assert_trees_all_equal(_spec(enc, p).dense(12, 12), dense)  # both rank 4

  def test_windowed_rope_windows_equal_its_dense_bias_bit_for_bit(self):
    enc = WindowedRoPE(8, 4, (0, 2), sink=True)
    p = np.stack([np.arange(12), np.arange(12) // 2])
    chex.assert_trees_all_equal(_spec(enc, p).dense(12, 12),
                                jnp.asarray(enc.attention_bias(p, p)))

  def test_bad_windows_are_refused_naming_the_value(self):
    with self.assertRaisesRegex(ValueError, r"lows must hold integers or None, got 1.5"):
      WindowBias((1.5,), (2,))
    with self.assertRaisesRegex(ValueError, 'one low and one high bound per head'):
      WindowBias((0, 0), (1,))
    q = jnp.zeros((1, 4, 2, 8))
    with self.assertRaisesRegex(ValueError, r'a WindowBias of 1 heads .* H=2'):
      aj.attention.scaled_dot_product_attention(q, q, q, score_bias=WindowBias((0,), (1,)))

  def test_the_chunked_kernel_refuses_windows_naming_them(self):
    q = jnp.zeros((1, 4, 1, 8))
    with self.assertRaisesRegex(ValueError, 'a window bias'):
      aj.attention.scaled_dot_product_attention(
          q, q, q, score_bias=WindowBias((0,), (1,)), implementation='chunked')


if __name__ == '__main__':
  absltest.main()
