"""FoX, forgetting attention (Lin et al. 2025), checked against the official code.

Official code: github.com/zhixuan-lin/forgetting-transformer at
883f260c636e87971339749b0d8310004794a5cc. Transcribed line by line below
(torch -> NumPy, float32 as the reference computes its scores):

* the op's reference path: the "reference implementation" block of `test_op`
  in src/forgetting_transformer/ops/forgetting_attention.py (last changed in
  15ec3008bb216614be11d55881937ba6edb2a34a), which the Triton kernel is
  tested against; head-first layout, queries the last M of N keys;
* the layer around it: `ForgettingAttentionLayer.forward` in
  src/forgetting_transformer/model/forgetting_transformer/modeling_forgetting_transformer.py
  with its defaults (fgate_type='full', no RoPE, no output gate / norm,
  no QK-norm, no shifts, no pruning): q/k/v/o `nn.Linear(bias=False)` and
  `fgate_proj = nn.Linear(hidden, num_heads, bias=True)`, torch layout
  (weights `[out, in]`).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax import positional as pe
from attention_jax.lab.config import field_checks
from attention_jax.lab.config import validate
from attention_jax.lab.config.facts import resolve_options  # the lab's options, defaults filled
from configs import copy as copy_config

D_MODEL, HEADS = 16, 2
HEAD_DIM = D_MODEL // HEADS

# ---------------------------------------------------------------------------
# Official code, transcribed.
# ---------------------------------------------------------------------------


def _official_logsigmoid(x):
  return -np.logaddexp(0.0, -x)  # torch.nn.functional.logsigmoid


def _official_softmax(p):
  p = p - p.max(axis=-1, keepdims=True)
  e = np.exp(p)
  return e / e.sum(axis=-1, keepdims=True)


def _official_reference(q, k, v, log_fgate, sm_scale, seq_start=None):
  """test_op's reference: q `[Z, H, M, D]`, k, v `[Z, H, N, D]`, log_fgate
  `[Z, H, N]` -> `[Z, H, M, D]` (causal=True, as the op always is)."""
  M, N = q.shape[2], k.shape[2]
  P_SEQ = N - M
  mask = np.tril(np.ones((M, N)), k=P_SEQ)
  p = np.matmul(q, np.swapaxes(k, 2, 3)) * sm_scale
  p = p.astype(np.float32)

  log_lambda = np.cumsum(log_fgate, axis=-1)
  decay_bias = log_lambda[..., -M:, None] - log_lambda[..., None, :]
  p = p + decay_bias
  p[:, :, mask == 0] = float('-inf')

  if seq_start is not None:
    attention_mask = np.arange(N) < seq_start[:, None, None, None]
    p = np.where(attention_mask, float('-inf'), p)
  with np.errstate(invalid='ignore'):
    p = _official_softmax(p.astype(np.float32))
  p = p.copy()
  p[np.isnan(p)] = 0.0
  return np.matmul(p, v)


def _official_layer(hidden_states, w, q_len=None):
  """`ForgettingAttentionLayer.forward` (defaults): hidden `[B, T, hidden]`
  -> `[B, T_q, hidden]`; with q_len, the queries are the last q_len tokens
  (a decoding step over a cache holding the earlier keys)."""
  batch_size, seq_len, _ = hidden_states.shape
  q_len = seq_len if q_len is None else q_len
  rearrange_heads = lambda x: x.reshape(*x.shape[:-1], HEADS, HEAD_DIM)  # '... (h d) -> ... h d'
  q = rearrange_heads(hidden_states[:, seq_len - q_len:] @ w['q_proj'].T)
  k = rearrange_heads(hidden_states @ w['k_proj'].T)
  v = rearrange_heads(hidden_states @ w['v_proj'].T).transpose(0, 2, 1, 3)  # b h t d
  fgate_logit = hidden_states @ w['fgate_proj.weight'].T + w['fgate_proj.bias']
  fgate_logit = fgate_logit.transpose(0, 2, 1)  # "b t h -> b h t"
  log_fgate = _official_logsigmoid(fgate_logit.astype(np.float32))
  k = k.transpose(0, 2, 1, 3)
  q = q.transpose(0, 2, 1, 3)
  o = _official_reference(q, k, v, log_fgate, sm_scale=1 / np.sqrt(HEAD_DIM))
  o = o.transpose(0, 2, 1, 3)  # "b h t d -> b t h d"
  o = o.reshape(batch_size, q_len, D_MODEL)
  return o @ w['o_proj'].T


# ---------------------------------------------------------------------------


def _official_weights(seed):
  """Torch-layout weights; the gate's spread so that heads forget at different
  rates (gates from about 0.1 to 0.99 on N(0, 1) inputs)."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape, s: (s * rng.normal(size=shape)).astype(np.float32)
  return {'q_proj': normal(D_MODEL, D_MODEL, s=0.3), 'k_proj': normal(D_MODEL, D_MODEL, s=0.3),
          'v_proj': normal(D_MODEL, D_MODEL, s=0.3), 'o_proj': normal(D_MODEL, D_MODEL, s=0.3),
          'fgate_proj.weight': normal(HEADS, D_MODEL, s=0.3),
          'fgate_proj.bias': np.array([0.5, 3.0], np.float32)}


def _mha(weights=None, **options):
  """Our module with the official weights copied in (kernels `[in, out]`)."""
  mha = aj.MultiHeadAttention(D_MODEL, HEADS, causal=True, encoding='fox', rngs=nnx.Rngs(0),
                              **options)
  if weights is not None:
    mha.W_Q.kernel[...] = jnp.asarray(weights['q_proj'].T.reshape(D_MODEL, HEADS, HEAD_DIM))
    mha.W_K.kernel[...] = jnp.asarray(weights['k_proj'].T.reshape(D_MODEL, HEADS, HEAD_DIM))
    mha.W_V.kernel[...] = jnp.asarray(weights['v_proj'].T.reshape(D_MODEL, HEADS, HEAD_DIM))
    mha.W_O.kernel[...] = jnp.asarray(weights['o_proj'].T.reshape(HEADS, HEAD_DIM, D_MODEL))
    mha.positional.gate_kernel[...] = jnp.asarray(weights['fgate_proj.weight'].T)
    mha.positional.gate_bias[...] = jnp.asarray(weights['fgate_proj.bias'])
  return mha


def _x(t=13, b=2, seed=1):
  return np.asarray(jax.random.normal(jax.random.key(seed), (b, t, D_MODEL)), np.float32)


class FoxMatchesTheOfficialCodeTest(chex.TestCase, parameterized.TestCase):

  def test_fox_layer_equals_the_official_layer(self):
    w, x = _official_weights(0), _x()
    want = _official_layer(x, w)
    got = nnx.jit(lambda m, x: m(x))(_mha(w, implementation='dense'), jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    # The gate matters: the same layer without it (log f = 0) differs.
    no_gate = dict(w, **{'fgate_proj.weight': 0 * w['fgate_proj.weight'],
                         'fgate_proj.bias': np.full(HEADS, 1e4, np.float32)})
    self.assertGreater(np.abs(_official_layer(x, no_gate) - want).max(), 1e-2)

  def test_fox_decoding_equals_the_official_suffix_queries(self):
    """The reference's M < N case (queries the last M keys): our cache after a
    prefill of N − M tokens, then the M queries in one `extend`."""
    w, x = _official_weights(1), _x(t=11)
    mha = _mha(w)
    cache = mha.init_cache(2, 11)
    self.assertEqual(cache['features'].shape, (2, 11, HEADS))

    @nnx.jit
    def prefill_then_extend(m, x, cache):
      _, cache = m.extend(x[:, :7], cache, 0)
      return m.extend(x[:, 7:], cache, 7)

    got, cache = prefill_then_extend(mha, jnp.asarray(x), cache)
    np.testing.assert_allclose(np.asarray(got), _official_layer(x, w, q_len=4),
                               rtol=1e-5, atol=1e-5)
    # The cache holds the keys' log gates, the official layer's log_fgate.
    want_log_fgate = _official_logsigmoid(x @ w['fgate_proj.weight'].T + w['fgate_proj.bias'])
    np.testing.assert_allclose(np.asarray(cache['features']), want_log_fgate, rtol=1e-6,
                               atol=1e-6)

  def test_fox_left_padding_equals_the_official_seq_start(self):
    """The reference's seq_start (keys before it hidden) = our dense mask."""
    w, x = _official_weights(2), _x(t=9)
    q, k, v = (np.asarray(a) for a in _official_qkv(x, w))
    log_fgate = _official_logsigmoid(x @ w['fgate_proj.weight'].T + w['fgate_proj.bias'])
    seq_start = np.array([3, 0])
    want = _official_reference(q, k, v, log_fgate.transpose(0, 2, 1), 1 / np.sqrt(HEAD_DIM),
                               seq_start=seq_start)
    enc = _mha(w).positional
    mask = np.arange(9)[None, None, None, :] >= seq_start[:, None, None, None]
    spec = enc.score_contribution(aj.ScoreContext(
        q=q.transpose(0, 2, 1, 3), k=k.transpose(0, 2, 1, 3), q_positions=np.arange(9),
        k_positions=np.arange(9), q_slots=np.arange(9), q_features=log_fgate,
        k_features=log_fgate, mask=mask))
    got = aj.scaled_dot_product_attention(
        *(jnp.asarray(a.transpose(0, 2, 1, 3)) for a in (q, k, v)), mask=mask, score_bias=spec,
        causal=True, implementation='dense')
    got = np.asarray(got).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got[0, :, 3:], want[0, :, 3:], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)

  def test_fox_pure_bias_equals_the_official_decay_bias(self):
    rng = np.random.default_rng(3)
    log_fgate = _official_logsigmoid(rng.normal(size=(2, 7, HEADS)).astype(np.float32) * 3)
    log_lambda = np.cumsum(log_fgate.transpose(0, 2, 1), axis=-1)
    want = log_lambda[..., :, None] - log_lambda[..., None, :]
    got = jax.jit(pe.forget_gate_bias)(log_fgate)
    self.assertEqual(got.dtype, jnp.float32)
    c = pe.cumulative_log_gates(log_fgate)  # [B, T, H], as log f: Flax's order
    np.testing.assert_allclose(np.asarray(c), log_lambda.transpose(0, 2, 1), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(pe.forget_gate_bias(pe.cumulative_log_gates(log_fgate), cumulative=True)),
        want, rtol=1e-6, atol=1e-6)
    with self.assertRaisesRegex(ValueError, r'fox: forget_gate_bias takes \[B, T, H\]'):
      pe.forget_gate_bias(log_fgate[0])
    # Σ_{l=j+1..i} log f_l, written out for one entry.
    np.testing.assert_allclose(np.asarray(got)[1, 0, 5, 2], log_fgate[1, 3:6, 0].sum(),
                               rtol=1e-6)


def _official_qkv(x, w):
  heads = lambda a: a.reshape(*a.shape[:-1], HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
  return tuple(heads(x @ w[name].T) for name in ('q_proj', 'k_proj', 'v_proj'))


class FoxKernelsAgreeTest(chex.TestCase):

  def test_fox_chunked_equals_dense_and_the_official_layer(self):
    """Both chunked strategies: outputs equal the official layer, and outputs
    and gradients (to x and every parameter, the gate's included) equal the
    dense kernel's; with key padding and 21 tokens in blocks of 8."""
    w, x = _official_weights(4), _x(t=21)
    lengths = jnp.array([21, 9])
    cotangent = jax.random.normal(jax.random.key(7), (2, 21, D_MODEL))
    # Row 1 has 9 keys: its first 9 queries are the official layer on 9 tokens.
    want = (_official_layer(x[:1], w), _official_layer(x[1:, :9], w))

    def loss(m, x):
      out = m(x, kv_lengths=lengths)
      return jnp.sum(out * cotangent), out

    results = {}
    for name, options in (('dense', dict(implementation='dense')),
                          ('scan', dict(implementation='chunked', chunked_strategy='scan',
                                        chunk_size=8)),
                          ('unrolled', dict(implementation='chunked',
                                            chunked_strategy='unrolled', chunk_size=8))):
      (_, out), (g_params, g_x) = nnx.jit(nnx.value_and_grad(
          loss, argnums=(0, 1), has_aux=True))(_mha(w, **options), jnp.asarray(x))
      np.testing.assert_allclose(np.asarray(out[:1]), want[0], rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(np.asarray(out[1:, :9]), want[1], rtol=1e-5, atol=1e-5)
      results[name] = (out, nnx.to_pure_dict(g_params), g_x)
    for name in ('scan', 'unrolled'):
      chex.assert_trees_all_close(results[name], results['dense'], atol=2e-5, rtol=1e-4)
    g_gate = results['dense'][1]['positional']
    for name in ('gate_kernel', 'gate_bias'):  # the test can see the gate's gradient
      self.assertGreater(float(jnp.abs(g_gate[name]).max()), 1e-3)


class FoxDtypesTest(chex.TestCase, parameterized.TestCase):

  def test_fox_bfloat16_path(self):
    """bf16 activations: the log gates stay float32; outputs close to f32."""
    w, x = _official_weights(5), _x(t=10)
    want = _official_layer(x, w)
    for implementation in ('dense', 'chunked'):
      mha = _mha(w, dtype=jnp.bfloat16, implementation=implementation, chunk_size=4)
      xb = jnp.asarray(x, jnp.bfloat16)
      features = mha.positional.token_features(xb)
      self.assertEqual(features.dtype, jnp.float32)
      out = nnx.jit(lambda m, x: m(x))(mha, xb)
      self.assertEqual(out.dtype, jnp.bfloat16)
      chex.assert_tree_all_finite(out)
      np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=5e-2)


class FoxModelTest(chex.TestCase):

  def test_fox_gate_per_layer_with_the_official_init(self):
    self.assertTrue(aj.ENCODINGS['fox'].per_layer)  # TransformerLM builds one per block
    enc = pe.make_encoding('fox', d_model=64, num_heads=4, rngs=nnx.Rngs(0))
    other = pe.make_encoding('fox', d_model=64, num_heads=4, rngs=nnx.Rngs(1))
    kernel = np.asarray(enc.gate_kernel[...])
    self.assertEqual(kernel.shape, (64, 4))
    self.assertBetween(float(kernel.std()), 0.017, 0.023)  # official: N(0, 0.02²)
    np.testing.assert_array_equal(np.asarray(enc.gate_bias[...]), 0.0)  # official: zeros
    self.assertFalse(np.allclose(kernel, np.asarray(other.gate_kernel[...])))

  def test_fox_decay_time_bias(self):
    enc = pe.make_encoding('fox', d_model=8, num_heads=4, rngs=nnx.Rngs(0),
                           decay_times=(2.0, 256.0))
    log_f = np.asarray(jax.nn.log_sigmoid(enc.gate_bias[...]))
    np.testing.assert_allclose(-1.0 / log_f, np.geomspace(2.0, 256.0, 4), rtol=1e-4)


class FoxErrorsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('fox_weight_std', dict(weight_std=-0.1), r'fox: weight_std=-0.1 must be a finite '
       r'number >= 0'),
      ('fox_bias_init', dict(bias_init=float('inf')), r'fox: bias_init=inf must be a finite'),
      ('fox_decay_times_length', dict(decay_times=(1.0,)), r'fox: decay_times=\(1.0,\) must '
       r'be \(T_min, T_max\)'),
      ('fox_decay_times_value', dict(decay_times=(0.0, 8.0)), r'fox: decay_times\[0\]=0.0 '
       r'must be a finite number > 0'),
      ('fox_decay_times_type', dict(decay_times=4.0), r'fox: decay_times=4.0 must be'),
      ('fox_both_inits', dict(bias_init=1.0, decay_times=(1.0, 8.0)), r'fox: give '
       r'bias_init=1.0 or decay_times'))
  def test_fox_bad_options_name_the_key(self, options, message):
    with self.assertRaisesRegex(ValueError, message):
      pe.make_encoding('fox', d_model=8, num_heads=2, rngs=nnx.Rngs(0), **options)

  def test_fox_is_causal_self_attention_only(self):
    with self.assertRaisesRegex(ValueError, r'fox: .*causal=False is not supported'):
      aj.MultiHeadAttention(8, 2, encoding='fox', causal=False, rngs=nnx.Rngs(0))
    enc = pe.make_encoding('fox', d_model=8, num_heads=2, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r'FoX was built with causal=True'):
      aj.MultiHeadAttention(8, 2, encoding=enc, causal=False, rngs=nnx.Rngs(0))
    x = jnp.ones((1, 3, 8))
    qk = jnp.ones((1, 3, 2, 4))
    features = enc.token_features(x)
    context = dict(q=qk, k=qk, q_positions=np.arange(3), k_positions=np.arange(3),
                   q_features=features, k_features=features)
    with self.assertRaisesRegex(ValueError, r'fox: .*cross-attention has none'):
      enc.score_contribution(aj.ScoreContext(**context))
    with self.assertRaisesRegex(ValueError, r'fox: .*causal=False'):
      enc.score_contribution(aj.ScoreContext(**context, q_slots=np.arange(3), causal=False))
    with self.assertRaisesRegex(ValueError, r'fox: the gate reads layer inputs \[B, T, 8\]'):
      enc.token_features(jnp.ones((1, 3, 6)))
    with self.assertRaisesRegex(ValueError, r"'fox' got an unknown option among \['init'\]"):
      pe.make_encoding('fox', d_model=8, num_heads=2, rngs=nnx.Rngs(0), init=1.0)

  def test_fox_lab_config_and_kernel_check(self):
    config = resolve_options(copy_config.get_config('encoding=fox,scale=tiny'))
    self.assertEqual(config.model.encoding_options.fox.weight_std, 0.02)
    validate.validate_config(config)
    # A DifferenceBias: the chunked kernel serves it.
    config.model.attention_implementation = 'chunked'
    self.assertIsNone(field_checks.kernel_refusal(config, 'fox'))
    validate.validate_config(config)
    config.model.encoding_options.fox.weight_std = -1.0
    with self.assertRaisesRegex(validate.ConfigError,
                                r'model\.encoding_options\.fox\.weight_std=-1.0 must be a finite'):
      validate.validate_config(config)


if __name__ == '__main__':
  absltest.main()
