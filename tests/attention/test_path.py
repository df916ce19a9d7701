"""PaTH attention's pure functions: against FLA's reference, the definition,
dense against blockwise, slots, dtypes, refusals."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest
from absl.testing import parameterized

import attention_jax as aj
from attention_jax.attention import path
from attention_jax.attention.capabilities import Request
from attention_jax.attention.path_blockwise import AUTO_MIN_KEYS
from attention_jax.attention.path_blockwise import path_attention
from tests import tiers


# ---------------------------------------------------------------------------
# A transcription of FLA's reference, `naive_path_attn`, in
# fla-org/flash-linear-attention at bc3b101dcb713ddc5bd8924b66754eb68b5ccf89,
# fla/ops/path_attn/naive.py (last changed in f7c2c191; its test,
# tests/ops/test_path_attn.py, compares the Triton kernels with it), line by
# line in jax.numpy so that gradients can be compared too. Same inputs: q
# [B, T, HQ, D], k, v, w [B, T, H, D], beta [B, T, H], g [B, T, HQ] (log
# forget gates, zeros for none), scale. Note that it adds the gate's
# c_i - c_j before multiplying by `scale`, as FLA's kernels do.
# ---------------------------------------------------------------------------
def naive_path_attn(q, k, v, w, beta, g, scale, chunk_size=64):
  hq, h, bt = q.shape[2], k.shape[2], chunk_size
  original_dtype = q.dtype
  q, k, v, w, beta, g = (jnp.swapaxes(jnp.asarray(x, jnp.float32), 1, 2)
                         for x in (q, k, v, w, beta, g))
  g_cumsum = jnp.cumsum(g, -1)
  rep = lambda x: jnp.repeat(x, hq // h, axis=1)  # expand(...).flatten(1, 2)
  k, v, w, beta = rep(k), rep(v), rep(w), rep(beta)
  b, hh, l, _ = q.shape
  if l % bt:
    pad = bt - l % bt
    q, k, w = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (q, k, w))
    beta = jnp.pad(beta, ((0, 0), (0, 0), (0, pad)))
  seq_len = q.shape[2]
  w_beta = w * beta[..., None]
  split = lambda x: x.reshape(b, hh, seq_len // bt, bt, x.shape[-1])
  q, k, w, w_beta = split(q), split(k), split(w), split(w_beta)
  mask = np.triu(np.ones((bt, bt), bool), 0)
  t_mat = -jnp.where(mask, 0.0, w_beta @ jnp.swapaxes(w, -1, -2))
  # for i in range(1, BT): T[..., i, :i] += (T[..., i, :, None] * T[..., :, :i]).sum(-2),
  # as a fori_loop over rows (columns >= i masked), so that it traces once.
  def row(i, t_mat):
    update = (t_mat[..., i, :, None] * t_mat).sum(-2)
    new = jnp.where(jnp.arange(bt) < i, t_mat[..., i, :] + update, t_mat[..., i, :])
    return jax.lax.dynamic_update_index_in_dim(t_mat, new, i, axis=-2)
  t_mat = jax.lax.fori_loop(1, bt, row, t_mat)
  t_mat = t_mat + jnp.eye(bt)
  twbk = t_mat @ jnp.where(mask, 0.0, w_beta @ jnp.swapaxes(k, -1, -2))
  qw = jnp.tril(q @ jnp.swapaxes(w, -1, -2))
  twb = t_mat @ w_beta
  a_local = jnp.tril(q @ jnp.swapaxes(k, -1, -2)) - qw @ twbk
  q = q - qw @ twb
  k = k - jnp.swapaxes(twbk, -1, -2) @ w
  h_mat = jnp.swapaxes(w, -1, -2) @ twb
  a = jnp.zeros((b, hh, seq_len, seq_len))
  merge = lambda x: x.reshape(b, hh, seq_len, x.shape[-1])
  q, k = merge(q), merge(k)
  for i in range(0, seq_len, bt):
    q_i = q[:, :, i:i + bt]
    for j in range(i - bt, -bt, -bt):
      a = a.at[:, :, i:i + bt, j:j + bt].set(q_i @ jnp.swapaxes(k[:, :, j:j + bt], -1, -2))
      q_i = q_i - q_i @ h_mat[:, :, j // bt]
  for i in range(seq_len // bt):
    a = a.at[:, :, i * bt:(i + 1) * bt, i * bt:(i + 1) * bt].set(a_local[:, :, i])
  a = jnp.where(np.tril(np.ones((seq_len, seq_len), bool)), a, -jnp.inf)[:, :, :l, :l]
  a = a + g_cumsum[..., None] - g_cumsum[..., None, :]
  out = jax.nn.softmax(a * scale, -1) @ v
  return jnp.swapaxes(out.astype(original_dtype), 1, 2)


def definition_logits(q, k, w, beta):
  """NumPy float64, from the formula: k_jᵀ H_{j+1} … H_i q_i, one example
  and head: q, k, w [T, D], beta [T] -> [T, T] (0 above the diagonal)."""
  q, k, w, beta = (np.asarray(a, np.float64) for a in (q, k, w, beta))
  t, d = q.shape
  out = np.zeros((t, t))
  for i in range(t):
    u = q[i].copy()  # H_{j+1} … H_i q_i, built from j = i down
    for j in range(i, -1, -1):
      out[i, j] = k[j] @ u
      u = u - beta[j] * w[j] * (w[j] @ u)  # now H_j … H_i q_i
  return out


def inputs(b=2, t=11, h=4, h_kv=2, d=8, seed=0, gate=True, beta_range=(0.0, 2.0)):
  keys = jax.random.split(jax.random.key(seed), 6)
  q = jax.random.normal(keys[0], (b, t, h, d))
  k = jax.random.normal(keys[1], (b, t, h_kv, d))
  v = jax.random.normal(keys[2], (b, t, h_kv, d))
  w = jax.random.normal(keys[3], (b, t, h_kv, d))
  w = w / jnp.linalg.norm(w, axis=-1, keepdims=True)
  beta = jax.random.uniform(keys[4], (b, t, h_kv), minval=beta_range[0], maxval=beta_range[1])
  g = (jnp.log(jax.random.uniform(keys[5], (b, t, h), minval=0.9, maxval=1.0)) if gate
       else jnp.zeros((b, t, h)))
  return q, k, v, w, beta, g


def dense_path(q, k, v, w, beta, g, **options):
  """PaTH(-FoX) through the library's dense kernel, FLA's gate scaling."""
  scale = q.shape[-1] ** -0.5
  spec = path.HouseholderScores(q, k, w, beta, **options)
  c = jnp.cumsum(g, 1) * scale
  return aj.scaled_dot_product_attention(
      q, k, v, score_bias=(spec, aj.DifferenceBias(c, c)), causal=True,
      implementation='dense')


class PathLogitsTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('one_block', 16), ('blocks_of_4', 4), ('blocks_of_3', 3),
                                  ('blocks_of_1', 1))
  def test_path_logits_equal_the_definition(self, block_size):
    q, k, _, w, beta, _ = inputs(b=1, t=10, h=2, h_kv=2)
    got = path.path_logits(q, k, w, beta, block_size=block_size)
    for hd in range(2):
      want = definition_logits(q[0, :, hd], k[0, :, hd], w[0, :, hd], beta[0, :, hd])
      np.testing.assert_allclose(got[0, hd], want, atol=2e-5, rtol=2e-5)

  def test_beta_zero_is_plain_attention(self):
    q, k, _, w, beta, _ = inputs(t=9)
    got = path.path_logits(q, k, w, 0.0 * beta, block_size=4)
    want = jnp.einsum('bqhd,bkhd->bhqk', q, jnp.repeat(k, 2, axis=2))
    chex.assert_trees_all_close(got, jnp.where(np.tril(np.ones((9, 9), bool)), want, 0.0),
                                atol=1e-5)

  @parameterized.named_parameters(('decode_one', [9]), ('prompt', [5, 6, 7]),
                                  ('every_slot', list(range(11))), ('unordered', [3, 0, 10]))
  def test_logits_at_slots_equal_the_full_pass(self, slots):
    q, k, _, w, beta, _ = inputs(t=11)
    full = path.path_logits(q, k, w, beta, block_size=4)
    got = path.path_logits_at(q[:, np.array(slots)], k, w, beta, np.array(slots), block_size=4)
    keep = np.arange(11)[None, :] <= np.array(slots)[:, None]
    chex.assert_trees_all_close(got, jnp.where(keep, full[:, :, np.array(slots)], 0.0),
                                atol=2e-5, rtol=2e-5)

  def test_later_slots_do_not_enter(self):
    q, k, _, w, beta, _ = inputs(t=11)
    got = path.path_logits_at(q[:, 4:5], k, w, beta, np.array([4]), block_size=4)
    k2, w2, beta2 = (a.at[:, 5:].set(a[:, 5:] * 3.0 + 1.0) for a in (k, w, beta))
    changed = path.path_logits_at(q[:, 4:5], k2, w2, beta2, np.array([4]), block_size=4)
    chex.assert_trees_all_close(got, changed)

  def test_bad_shapes_and_block_size_are_refused(self):
    q, k, _, w, beta, _ = inputs(t=6)
    with self.assertRaisesRegex(ValueError, r'path_logits: takes q \[B, T_q, H, D\].*beta '
                                r'\(6, 2\)'):
      path.path_logits(q, k, w, beta[0])
    with self.assertRaisesRegex(ValueError, r'T_q == T_k, got 3 and 6'):
      path.path_logits(q[:, :3], k, w, beta)
    with self.assertRaisesRegex(ValueError, r'block_size=0 must be an integer >= 1'):
      path.path_logits(q, k, w, beta, block_size=0)
    with self.assertRaisesRegex(ValueError, r'without q_slots is a full causal pass'):
      path.HouseholderScores(q[:, :3], k, w, beta)


class PathAgainstFlaReferenceTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('gate_gqa', True, 2, 11, 4), ('no_gate_mqa', False, 1, 13, 4),
      ('no_gate_gqa', False, 2, 11, 4), ('gate_mha', True, 4, 9, 64))
  @tiers.fast_cases(2)  # a gate and none, grouped and multi-query; the rest in the slow tier
  def test_dense_equals_naive_path_attn_outputs_and_gradients(self, gate, h_kv, t, chunk):
    args = inputs(t=t, h_kv=h_kv, gate=gate)
    scale = args[0].shape[-1] ** -0.5

    def loss(fn, *a):
      out = fn(*a)
      return jnp.sum(out * jnp.cos(jnp.arange(out.size).reshape(out.shape)))

    want = jax.jit(lambda *a: naive_path_attn(*a, scale, chunk_size=chunk))(*args)
    got = dense_path(*args, block_size=chunk)
    chex.assert_trees_all_close(got, want, atol=2e-5, rtol=2e-5)
    # jit: the reference's loops run eagerly op by op otherwise.
    grad_of = lambda fn: jax.jit(jax.grad(lambda *a: loss(fn, *a), argnums=range(6)))(*args)
    grads_want = grad_of(lambda *a: naive_path_attn(*a, scale, chunk_size=chunk))
    grads_got = grad_of(lambda *a: dense_path(*a, block_size=chunk))
    if not gate:  # g is the zeros the reference is given for none
      grads_want, grads_got = grads_want[:5], grads_got[:5]
    chex.assert_trees_all_close(grads_got, grads_want, atol=2e-4, rtol=2e-4)

  @parameterized.named_parameters(('gate', True), ('no_gate', False))
  @tiers.fast_cases(1)  # the gated form has the other's terms and more
  def test_blockwise_equals_naive_path_attn_outputs_and_gradients(self, gate):
    args = inputs(t=11, gate=gate)
    scale = args[0].shape[-1] ** -0.5
    loss = lambda out: jnp.sum(out * jnp.sin(jnp.arange(out.size).reshape(out.shape)))
    want_fn = lambda *a: naive_path_attn(*a, scale, chunk_size=4)
    got_fn = lambda q, k, v, w, beta, g: path_attention(
        q, k, v, w, beta, jnp.cumsum(g, 1) * scale, block_size=4)
    chex.assert_trees_all_close(got_fn(*args), want_fn(*args), atol=2e-5, rtol=2e-5)
    grads = [jax.jit(jax.grad(lambda *a: loss(f(*a)), argnums=range(6)))(*args)
             for f in (got_fn, want_fn)]
    chex.assert_trees_all_close(grads[0], grads[1], atol=2e-4, rtol=2e-4)


class PathBlockwiseTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('b1', 1), ('b3', 3), ('b4', 4), ('b8', 8), ('b32', 32))
  @tiers.fast_cases(3)
  def test_blockwise_equals_dense_for_any_block_size(self, block_size):
    q, k, v, w, beta, g = inputs(t=13)
    scale = q.shape[-1] ** -0.5
    c = jnp.cumsum(g, 1) * scale
    want = dense_path(q, k, v, w, beta, g, block_size=5)
    got = path_attention(q, k, v, w, beta, c, block_size=block_size)
    chex.assert_trees_all_close(got, want, atol=2e-5, rtol=2e-5)

  @pytest.mark.slow  # ~30 s cold; the module test through 'auto' covers the dispatch
  def test_blockwise_kernel_through_the_dispatcher(self):
    q, k, v, w, beta, g = inputs(t=10)
    scale = q.shape[-1] ** -0.5
    c = jnp.cumsum(g, 1) * scale
    score_bias = (path.HouseholderScores(q, k, w, beta, block_size=4), aj.DifferenceBias(c, c))
    loss = lambda impl: lambda q, k, v, w, beta, c: jnp.sum(jnp.tanh(
        aj.scaled_dot_product_attention(
            q, k, v, score_bias=(path.HouseholderScores(q, k, w, beta, block_size=4),
                                 aj.DifferenceBias(c, c)),
            causal=True, implementation=impl)))
    got = aj.scaled_dot_product_attention(q, k, v, score_bias=score_bias, causal=True,
                                          implementation='path_blockwise')
    want = aj.scaled_dot_product_attention(q, k, v, score_bias=score_bias, causal=True,
                                           implementation='dense')
    chex.assert_trees_all_close(got, want, atol=2e-5, rtol=2e-5)
    args = (q, k, v, w, beta, c)
    chex.assert_trees_all_close(jax.grad(loss('path_blockwise'), argnums=range(6))(*args),
                                jax.grad(loss('dense'), argnums=range(6))(*args),
                                atol=1e-4, rtol=1e-4)

  def test_stored_walks_give_the_rematerialised_gradients(self):
    q, k, v, w, beta, g = inputs(t=13)
    c = jnp.cumsum(g, 1) * q.shape[-1] ** -0.5
    grads = lambda remat: jax.grad(lambda *a: jnp.sum(jnp.tanh(path_attention(
        *a, c, block_size=4, rematerialize=remat))), argnums=range(5))(q, k, v, w, beta)
    chex.assert_trees_all_close(grads(False), grads(True), atol=1e-5, rtol=1e-5)
    with self.assertRaisesRegex(TypeError, 'rematerialize must be True or False'):
      path_attention(q, k, v, w, beta, c, rematerialize='no')

  def test_padding_keys_by_kv_lengths(self):
    q, k, v, w, beta, _ = inputs(t=10)
    lengths = jnp.array([10, 6])
    spec = path.HouseholderScores(q, k, w, beta, block_size=4)
    got, want = (aj.scaled_dot_product_attention(q, k, v, score_bias=spec, causal=True,
                                                 kv_lengths=lengths, implementation=impl)
                 for impl in ('path_blockwise', 'dense'))
    chex.assert_trees_all_close(got, want, atol=2e-5, rtol=2e-5)

  @parameterized.named_parameters(('bfloat16', jnp.bfloat16), ('float32', jnp.float32))
  def test_dtypes_accumulate_in_float32(self, dtype):
    q, k, v, w, beta, g = inputs(t=12)
    low = [a.astype(dtype) for a in (q, k, v)]
    scale = q.shape[-1] ** -0.5
    c = jnp.cumsum(g, 1) * scale
    spec = path.HouseholderScores(*low[:2], w, beta, block_size=4)
    outs = {impl: aj.scaled_dot_product_attention(
        *low, score_bias=(spec, aj.DifferenceBias(c, c)), causal=True, implementation=impl)
            for impl in ('path_blockwise', 'dense')}
    # The reference on the same rounded inputs, in float32.
    want = naive_path_attn(*[a.astype(jnp.float32) for a in low], w, beta, g, scale, 4)
    for impl, out in outs.items():
      self.assertEqual(out.dtype, dtype, impl)
      tol = 2e-5 if dtype == jnp.float32 else 1e-2  # bf16 output rounding
      chex.assert_trees_all_close(out.astype(jnp.float32), want, atol=tol, rtol=tol)

  def test_other_kernels_refuse_with_the_reason(self):
    q, k, v, w, beta, _ = inputs(t=8)
    spec = path.HouseholderScores(q, k, w, beta)
    with self.assertRaisesRegex(ValueError, r"implementation='chunked' cannot serve.*a "
                                r"Householder transform of q·k \(PaTH\).*'path_blockwise'"):
      aj.scaled_dot_product_attention(q, k, v, score_bias=spec, causal=True,
                                      implementation='chunked')
    with self.assertRaisesRegex(ValueError, r"implementation='path_blockwise' cannot serve.*"
                                r'causal=False \(it serves causal attention only\)'):
      aj.scaled_dot_product_attention(q, k, v, score_bias=spec, implementation='path_blockwise')
    with self.assertRaisesRegex(ValueError, r"'path_blockwise' cannot serve.*a dense mask"):
      aj.scaled_dot_product_attention(q, k, v, score_bias=spec, causal=True,
                                      mask=aj.causal_mask(8), implementation='path_blockwise')

  def test_auto_picks_blockwise_from_its_threshold(self):
    for t, want in ((AUTO_MIN_KEYS - 1, 'dense'), (AUTO_MIN_KEYS, 'path_blockwise')):
      request = Request(t_k=t, dtype=jnp.float32, head_dim=8, causal=True,
                        scores=(path.HouseholderScores,))
      self.assertEqual(aj.attention.select_implementation('auto', request, 'cpu'), want)


if __name__ == '__main__':
  absltest.main()
