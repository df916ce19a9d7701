"""Stick-breaking attention (Tan et al., ICLR 2025): the dense version against
the official reference, the blockwise one against the dense one (forward and
gradients), and the modules, the cache and the lab built on them."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.attention.blockwise_stick_breaking import chunked_stick_breaking
from attention_jax.attention.dense import dense_kernel
from attention_jax.attention.normalization import StickBreaking
from attention_jax.attention.scores import DifferenceBias
from attention_jax.attention.scores import LinearBias
from attention_jax.lab.config import identity
from attention_jax.lab.runs import plan
from attention_jax.lab.config.entries import run_label
from attention_jax.lab.protocols import decoder
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.config.validate import validate_config
from attention_jax.lab.config.resolved import resolve
from configs import copy as copy_config

# ---------------------------------------------------------------------------
# The official reference, transcribed from github.com/shawntan/stickbreaking-attention
# (commit ea69b8dd): `stickbreaking` in stickbreaking_attention/sb_ref.py and
# `ref_fwd` in tests/test_attn.py. torch -> NumPy; mask True = masked out
# (masked_fill); [B, H, T, D] as there. Computed in float64.
# ---------------------------------------------------------------------------


def _official_logsigmoid(x):
  return -np.logaddexp(0.0, -x)


def _official_stickbreaking(q, k, v, mask, cum_weight):
  logits = (q @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])
  log_z = np.where(mask, -1e5, _official_logsigmoid(logits))
  log_beta = np.where(mask, 0.0, _official_logsigmoid(-logits))
  re_cum_log_beta = np.einsum('bhij,jk->bhik', log_beta, cum_weight)
  log_att = log_z + re_cum_log_beta
  att = np.exp(log_att)
  return att @ v, 1 - att.sum(-1)


def _official_ref_fwd(q, k, v, length, attend_current=False):
  cm = np.tril(np.ones((length, length)), -1)
  mask = np.triu(np.ones((length, length)), 1 if attend_current else 0).astype(bool)
  o, rem = _official_stickbreaking(q, k, v, mask, cm)
  return o + rem[..., None] * v


# ---------------------------------------------------------------------------

B, T, H, D = 2, 37, 4, 8  # T divisible by none of the chunk sizes used
SLOPES = (0.5, 0.25, 0.125, 0.0625)


def _qkv(h_kv=H, dtype=jnp.float32, t=T):
  """NumPy draws (no small eager programs to compile) as jnp arrays."""
  rng = np.random.default_rng(0)
  q = rng.standard_normal((B, t, H, D))
  k, v = (rng.standard_normal((B, t, h_kv, D)) for _ in range(2))
  qv = rng.standard_normal((B, H, t)).swapaxes(1, 2)  # a difference bias per example
  kv = rng.standard_normal((1, H, t)).swapaxes(1, 2)  # broadcast over the batch
  return (*(jnp.asarray(x, dtype) for x in (q, k, v)),
          *(jnp.asarray(x, jnp.float32) for x in (qv, kv)))


def _dense(q, k, v, qv=None, kv=None, *, lengths=None, slopes=None, window=None,
           attend_current=False):
  scores = (() if slopes is None else (LinearBias(slopes),)) + (
      () if qv is None else (DifferenceBias(qv, kv),))
  return dense_kernel(q, k, v, mask=None, scores=scores, causal=True,
                      window=window, kv_lengths=lengths, return_weights=False,
                      normalization=StickBreaking(attend_current))[0]


def _mha(encoding, implementation):
  return aj.MultiHeadAttention(16, 4, causal=True, encoding=encoding, implementation=implementation,
                               chunk_size=5, normalization='stick_breaking',
                               rngs=nnx.Rngs(0))


def _lm(encoding, attend_current):
  return aj.TransformerLM(vocab_size=11, d_model=16, num_heads=4, num_layers=1, mlp_dim=32,
                          encoding=encoding, max_positions=32,
                          normalization=StickBreaking(attend_current), rngs=nnx.Rngs(0))


def _loss(f):
  return lambda *a: jnp.sum(jnp.sin(f(*a)))


class StickBreakingTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters(False, True)
  def test_stick_breaking_dense_equals_official(self, attend_current):
    rng = np.random.default_rng(0)
    shape = (B, H, 11, D)  # the official test's input distribution, [B, H, T, D]
    v = 0.25 * rng.standard_normal(shape)
    q = 0.25 * (rng.standard_normal(shape) + 1)
    k = 0.25 * (rng.standard_normal(shape) - 1)
    want = _official_ref_fwd(q, k, v, 11, attend_current)
    ours = lambda x: jnp.asarray(np.swapaxes(x, 1, 2), jnp.float32)  # -> [B, T, H, D]
    got, weights = aj.stick_breaking_attention(ours(q), ours(k), ours(v),
                                               attend_current=attend_current,
                                               return_weights=True)
    np.testing.assert_allclose(np.swapaxes(np.asarray(got), 1, 2), want, atol=1e-5)
    # Query 0 without attend_current has no key: all of it is its own value.
    self.assertEqual(float(np.asarray(weights)[:, :, 0].sum()) == 0.0, not attend_current)

  @parameterized.named_parameters(
      ('all_gqa', False, (8, 16), 2, None, True),
      ('window_attend_current', True, (16, 8), H, 10, True),
      ('multi_query_plain', True, (5, 7), 1, None, False))
  def test_stick_breaking_chunked_equals_dense_with_gradients(
      self, attend_current, chunks, h_kv, window, extras):
    q, k, v, qv, kv = _qkv(h_kv)
    lengths = jnp.array([T, 20]) if extras else None
    slopes = SLOPES if extras else None
    chunked = lambda q, k, v, qv, kv: chunked_stick_breaking(
        q, k, v, kv_lengths=lengths, alibi_slopes=None if slopes is None else jnp.array(slopes),
        difference=(qv, kv) if extras else None, window=window,
        attend_current=attend_current, q_chunk=chunks[0], k_chunk=chunks[1])
    dense = lambda q, k, v, qv, kv: _dense(
        q, k, v, *((qv, kv) if extras else ()), lengths=lengths, slopes=slopes,
        window=window, attend_current=attend_current)
    args = (q, k, v, qv, kv)
    run = lambda f: jax.jit(lambda *a: (f(*a), jax.grad(_loss(f), argnums=(0, 1, 2, 3, 4))(
        *a)))(*args)
    (got, got_grads), (want, want_grads) = run(chunked), run(dense)
    chex.assert_trees_all_close(got, want, atol=1e-5)
    chex.assert_trees_all_close(got_grads, want_grads, atol=2e-5)
    if extras:  # the difference values do get gradients
      self.assertGreater(np.abs(np.asarray(got_grads[3])).max(), 1e-3)

  def test_stick_breaking_bfloat16(self):
    q, k, v, qv, kv = _qkv(2)
    dense = lambda q, k, v: _dense(q, k, v, qv, kv, slopes=SLOPES)
    want = jax.jit(dense)(q, k, v)
    low = _qkv(2, jnp.bfloat16)[:3]
    chunked = lambda q, k, v: chunked_stick_breaking(
        q, k, v, alibi_slopes=jnp.array(SLOPES), difference=(qv, kv), q_chunk=8, k_chunk=16)
    got_chunked, grads = jax.jit(lambda *a: (chunked(*a), jax.grad(
        _loss(chunked), argnums=(0, 1, 2))(*a)))(*low)
    for got in (got_chunked, jax.jit(dense)(*low)):
      self.assertEqual(got.dtype, jnp.bfloat16)
      chex.assert_tree_all_finite(got)
      np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=5e-2)
    chex.assert_tree_all_finite(grads)
    self.assertEqual([g.dtype for g in grads], [jnp.bfloat16] * 3)

  def test_stick_breaking_fully_masked_query_gives_its_own_value(self):
    q, k, v, _, _ = _qkv()
    lengths = jnp.array([0, 5])  # example 0 has no key at all
    chunked = lambda q, k, v: chunked_stick_breaking(q, k, v, kv_lengths=lengths,
                                                     q_chunk=8, k_chunk=8)
    dense = lambda q, k, v: _dense(q, k, v, lengths=lengths)
    v_np = np.asarray(v)
    for f in (chunked, dense):
      out, grads = jax.tree.map(np.asarray, jax.jit(lambda *a, f=f: (
          f(*a), jax.grad(_loss(f), argnums=(0, 1, 2))(*a)))(q, k, v))
      np.testing.assert_array_equal(out[0], v_np[0])
      np.testing.assert_array_equal(out[1, 0], v_np[1, 0])  # query 0 sees no key j < 0
      chex.assert_tree_all_finite(grads)
      np.testing.assert_array_equal(grads[0][0], 0.0)
      np.testing.assert_array_equal(grads[1][0], 0.0)

  @parameterized.parameters('none', 'rope', 'alibi', 'fox')
  def test_stick_breaking_module_dense_equals_chunked(self, encoding):
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 13, 16)), jnp.float32)
    outs = []
    for implementation in ('dense', 'chunked'):
      # Forward only: the kernels' gradients, biases included, are compared
      # above; here the encodings' plumbing into each kernel.
      outs.append(jax.jit(_mha(encoding, implementation))(x))
    chex.assert_trees_all_close(outs[0], outs[1], atol=2e-5)

  # prefill: tokens read by the first extend (1: every token on its own).
  @parameterized.parameters(('rope', False, 1), ('fox', True, 5))
  def test_stick_breaking_cached_decoding_equals_full_pass(self, encoding, attend_current,
                                                           prefill):
    model = _lm(encoding, attend_current)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 11, (3, 12)), jnp.int32)
    want = jax.jit(lambda t: model(t))(tokens)
    step = jax.jit(lambda t, c, i: model.extend(t, c, i))
    cache, pieces = model.init_cache(3, 12), []
    for start, stop in zip([0, *range(prefill, 12)], range(prefill, 13)):
      logits, cache = step(tokens[:, start:stop], cache, jnp.int32(start))
      pieces.append(logits)
    chex.assert_trees_all_close(jnp.concatenate(pieces, 1), want, atol=2e-5)

  @parameterized.parameters(False, True)
  def test_stick_breaking_is_causal_through_gradients(self, attend_current):
    # The blockwise backward (the dense one agrees with it, see above).
    q, k, v, _, _ = _qkv(t=12)
    t = 6
    f = lambda q, k, v: chunked_stick_breaking(q, k, v, attend_current=attend_current,
                                               q_chunk=4, k_chunk=5)
    dq, dk, dv = map(np.asarray, jax.jit(jax.grad(
        lambda *a: jnp.sum(jnp.sin(f(*a)[:, t])), argnums=(0, 1, 2)))(q, k, v))
    for g in (dq, dk, dv):
      np.testing.assert_array_equal(g[:, t + 1:], 0.0)
    self.assertGreater(np.abs(dk[:, :t]).max(), 0.0)
    # Key t enters query t's weights only when it attends to itself; its
    # value always does (the remainder).
    self.assertEqual(bool(np.all(dk[:, t] == 0.0)), not attend_current)
    self.assertGreater(np.abs(dv[:, t]).max(), 0.0)

  def test_stick_breaking_errors(self):
    q, k, v, _, _ = _qkv(t=6)
    sdpa = aj.scaled_dot_product_attention
    with self.assertRaisesRegex(ValueError, r"normalization='bogus'; choose one of "
                                r"\('softmax', 'stick_breaking'\)"):
      sdpa(q, k, v, causal=True, normalization='bogus')
    with self.assertRaisesRegex(ValueError, r"normalization='bogus'; choose one of"):
      aj.MultiHeadAttention(16, 4, causal=True, normalization='bogus', rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, 'stick-breaking.*causal=True'):
      sdpa(q, k, v, normalization='stick_breaking')
    with self.assertRaisesRegex(ValueError, 'stick-breaking.*causal=True'):
      aj.MultiHeadAttention(16, 4, causal=False, normalization='stick_breaking',
                            rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r"'cudnn' cannot serve.*normalization="
                                r"'stick_breaking' \(it serves softmax\)"):
      sdpa(q, k, v, causal=True, normalization='stick_breaking', implementation='cudnn')
    with self.assertRaisesRegex(ValueError, r'StickBreaking\(attend_current=1\)'):
      StickBreaking(attend_current=1)
    with self.assertRaisesRegex(ValueError, 'stick-breaking is causal'):
      chunked_stick_breaking(q, k[:, :5], v[:, :5])

  def test_stick_breaking_lab_config(self):
    config = copy_config.get_config('encoding=none,scale=tiny')
    self.assertEqual(config.model.normalization, 'softmax')
    softmax_fields = identity.trained_fields(config)
    config.model.normalization = 'stick_breaking'
    validate_config(config)
    model = resolve(config).build_model(0)
    self.assertEqual(model.blocks[0].attention.normalization, StickBreaking(False))
    sb_fields = identity.trained_fields(config)
    self.assertEqual(sb_fields['model.normalization'], 'stick_breaking')
    self.assertNotEqual(softmax_fields, sb_fields)
    config.model.stick_breaking_attend_current = True
    self.assertNotEqual(identity.trained_fields(config), sb_fields)
    self.assertEqual(resolve(config).build_model(0).blocks[0].attention.normalization,
                     StickBreaking(True))
    bad = [(dict(normalization='bogus'), r"^invalid config: model.normalization has 'bogus'"),
           (dict(stick_breaking_attend_current='yes'),
            r'^invalid config: model.stick_breaking_attend_current=.yes. must be True or False'),
           (dict(normalization='softmax', stick_breaking_attend_current=True),
            r'^invalid config: model.stick_breaking_attend_current=True needs '
            r"model.normalization='stick_breaking'"),
           (dict(attention_implementation='cudnn'),
            r"^invalid config: model.attention_implementation='cudnn'.*normalization=")]
    for fields, message in bad:
      c = copy_config.get_config('encoding=none,scale=tiny')
      for key, value in dict(dict(normalization='stick_breaking'), **fields).items():
        del c.model[key]  # a config read from JSON need not keep the types
        c.model[key] = value
      with self.assertRaisesRegex(ConfigError, message):
        validate_config(c)

  def test_stick_breaking_study_entries(self):
    config = copy_config.get_config('scale=tiny')
    config.study.encodings = ('alibi', 'fox:stick_breaking')
    validate_config(config, study=True)
    runs = plan.run_configs(config)
    self.assertEqual([(r.model.encoding, r.model.normalization, run_label(r)) for r in runs],
                     [('alibi', 'softmax', 'alibi'),
                      ('fox', 'stick_breaking', 'fox:stick_breaking')])
    one = copy_config.get_config('encoding=none:stick_breaking,scale=tiny')
    self.assertEqual((one.model.encoding, one.model.normalization), ('none', 'stick_breaking'))
    config.study.encodings = ('fox:softmax',)
    with self.assertRaisesRegex(ConfigError, r"study.encodings: study entry 'fox:softmax': no "
                                r"part 'softmax'; the parts are coupled, .*stick_breaking"):
      validate_config(config, study=True)
    config.study.encodings = ('fox+stick_breaking',)  # the older grammar: told the new one
    with self.assertRaisesRegex(ConfigError, r"parts follow a colon, e.g. 'fox:stick_breaking'"):
      validate_config(config, study=True)

  def test_stick_breaking_fields_absent_from_an_older_run_read_as_softmax(self):
    config = copy_config.get_config('encoding=none,scale=tiny')
    older = copy_config.get_config('encoding=none,scale=tiny')
    del older.model['normalization'], older.model['stick_breaking_attend_current']
    self.assertEqual(identity.differences(older, config), [])
    config.model.normalization = 'stick_breaking'
    self.assertEqual(identity.differences(older, config),
                     [('model.normalization', 'softmax', 'stick_breaking')])


if __name__ == '__main__':
  absltest.main()
