"""CoPE (Golovneva et al. 2024) checked against the official forward.

The official code is github.com/facebookresearch/RAM,
projects/cope/src/cope/context_position.py, class `ContextPosSelfAttn`
(commit eff93c70445cbfcd0f9070c5c231d5466e282fb8), called from
projects/cope/src/models/transformer.py `MultiHeadAttn` (heads split into
the batch, key_cope = key). Its `forward` is transcribed line by line below
(torch -> NumPy, float32 as torch's default dtype; no dropout).
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
from attention_jax.lab.config import validate
from attention_jax.lab.config.facts import resolve_options  # the lab's options, defaults filled
from configs import copy as copy_config

# ---------------------------------------------------------------------------
# `ContextPosSelfAttn.forward` with the default flags (cope_val_gates=False,
# pos_emb='cope', cope_layers=1) and `cope_nodiv` as an argument. query, key,
# key_cope, val: `[B*H, L, D]` (`MultiHeadAttn.split_heads`); attn_mask:
# float `[B*H, L_q, L_k]` of 0/1 or None; pos_emb `[1, D, npos]`.
# ---------------------------------------------------------------------------


def _official_forward(query, key, key_cope, val, attn_mask, pos_emb, npos, head_dim,
                      cope_nodiv=False):
  gate_logits = np.matmul(query, key_cope.transpose(0, 2, 1))  # B x L(q) x L(k)
  gates = 1 / (1 + np.exp(-(gate_logits / np.float32(np.sqrt(head_dim)))))
  if attn_mask is not None:
    gates = gates * attn_mask
  positions = np.flip(np.cumsum(np.flip(gates, -1), axis=-1), -1)  # B x L x L
  unclamped = positions
  positions = np.minimum(positions, npos - 1)  # clamp(max=npos - 1)

  # let's compute for discrete fixed positions (1,2, .., T) first
  pos_logits_fixed = np.matmul(query, pos_emb)  # B x L x npos

  # now we need to intrapolate floor(p) and ceil(p) for position p
  positions_ceil = np.ceil(positions).astype(np.int64)
  positions_floor = np.floor(positions).astype(np.int64)
  pos_logits_ceil = np.take_along_axis(pos_logits_fixed, positions_ceil, -1)
  pos_logits_floor = np.take_along_axis(pos_logits_fixed, positions_floor, -1)

  pos_ceil_weight = positions - positions_floor
  pos_logits = pos_logits_ceil * pos_ceil_weight + pos_logits_floor * (1 - pos_ceil_weight)

  attn_logits = gate_logits  # not cope_sep_key, not cope_val_gates

  if cope_nodiv:
    attn_logits = attn_logits / np.float32(np.sqrt(head_dim))
    attn_logits = attn_logits + pos_logits
  else:
    attn_logits = attn_logits + pos_logits
    attn_logits = attn_logits / np.float32(np.sqrt(head_dim))

  if attn_mask is not None:
    with np.errstate(divide='ignore'):
      attn_logits = attn_logits + np.log(attn_mask)

  attn = np.exp(attn_logits - attn_logits.max(-1, keepdims=True))  # torch.softmax
  attn = attn / attn.sum(-1, keepdims=True)
  out = np.matmul(attn, val)  # B x L x H
  return attn_logits, attn, out, unclamped


# ---------------------------------------------------------------------------


def _split_heads(x):
  """Ours `[B, T, H, D]` -> the official `[B*H, T, D]` (batch-major)."""
  b, t, h, d = x.shape
  return np.asarray(x, np.float32).transpose(0, 2, 1, 3).reshape(b * h, t, d)


def _normal(seed, shape):
  """Test inputs from NumPy (jax.random would compile for each new shape)."""
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _cope(num_heads=3, head_dim=8, **options):
  if 'npos' not in options and 'max_positions' not in options:
    options['npos'] = 64  # cope refuses to guess its table's size
  return pe.make_encoding('cope', d_model=num_heads * head_dim, num_heads=num_heads,
                          rngs=nnx.Rngs(0), **options)


def _random_table(enc, seed):
  enc.pos_emb[...] = jnp.asarray(_normal(seed, enc.pos_emb.shape))


class CopeMatchesTheOfficialTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      # npos = 4 < T: far keys sit past position 3 and are clamped; one
      # key/value head (the official code has none: its keys are repeated).
      ('cope_causal_clamped_gqa', dict(causal=True, npos=4, h_kv=1, clamps=True)),
      # A mask as pad2attn_mask makes one (keys hidden, the query's own kept),
      # npos = T + 1 (the official block_size + 1): nothing clamped. --cope-nodiv.
      ('cope_causal_padding_nodiv', dict(causal=True, npos=10, mask=True, nodiv=True)),
      # The official encoder: no causal mask, positions counted to the last key.
      ('cope_bidirectional', dict(causal=False, npos=5, mask=True, clamps=True)),
      # Cross-attention: 5 queries over 9 keys, none of them a query.
      ('cope_cross', dict(causal=False, npos=10, mask=True, t_q=5)))
  def test_cope_logits_weights_and_outputs(self, case):
    b, h, d, t_k = 2, 3, 8, 9
    t_q, h_kv, causal = case.get('t_q', t_k), case.get('h_kv', h), case['causal']
    q = jnp.asarray(_normal(1, (b, t_q, h, d)))
    k, v = (jnp.asarray(_normal(s, (b, t_k, h_kv, d))) for s in (2, 3))
    enc = _cope(h, d, npos=case['npos'], nodiv=case.get('nodiv', False))
    _random_table(enc, 2)
    keep = np.ones((b, 1, t_q, t_k), bool)
    if case.get('mask'):
      keep = np.random.default_rng(3).random((b, 1, t_q, t_k)) > 0.3
      keep[..., np.arange(t_q), np.arange(t_q)] = True  # as pad2attn_mask: no empty row
    visible = keep & (np.tril(np.ones((t_q, t_k), bool)) if causal else True)
    self_attention = t_q == t_k

    @nnx.jit
    def ours(enc, q, k, v, keep):
      spec = enc.score_contribution(aj.ScoreContext(
          q=q, k=k, q_positions=np.arange(t_q), k_positions=np.arange(t_k),
          q_slots=np.arange(t_q) if self_attention else None, causal=causal,
          mask=keep if case.get('mask') else None))
      self.assertIsInstance(spec, aj.DenseBias)
      out, weights = aj.scaled_dot_product_attention(
          q, k, v, mask=keep, score_bias=spec, causal=causal, implementation='dense',
          return_weights=True)
      return spec.bias, out, weights

    bias, out, weights = ours(enc, q, k, v, jnp.asarray(keep))
    self.assertEqual(bias.dtype, jnp.float32)
    chex.assert_shape(bias, (b, h, t_q, t_k))

    group = h // h_kv
    k_full, v_full = (np.repeat(np.asarray(a), group, axis=2) for a in (k, v))
    mask = np.broadcast_to(visible, (b, h, t_q, t_k)).reshape(b * h, t_q, t_k)
    want_logits, want_weights, want_out, unclamped = _official_forward(
        _split_heads(q), _split_heads(k_full), _split_heads(k_full), _split_heads(v_full),
        mask.astype(np.float32), np.asarray(enc.pos_emb[...])[None], case['npos'], d,
        cope_nodiv=case.get('nodiv', False))
    logits = np.einsum('bqhd,bkhd->bhqk', q, k_full) / np.sqrt(d) + bias
    logits = np.asarray(logits).reshape(b * h, t_q, t_k)
    np.testing.assert_allclose(logits[mask], want_logits[mask], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(weights).reshape(b * h, t_q, t_k), want_weights,
                               rtol=1e-5, atol=1e-6)
    want_out = want_out.reshape(b, h, t_q, d).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    # The test can see the positions: fractional, and clamped where npos < T.
    seen = unclamped[mask]
    self.assertGreater(np.abs(seen - np.round(seen)).max(), 0.1)
    self.assertEqual(bool((seen > case['npos'] - 1).any()), case.get('clamps', False))

  def test_cope_positions_count_the_visible_gates(self):
    """Gates of 1 count keys: p_ij = i − j + 1 under a causal mask; a hidden
    key is not counted by the positions before it."""
    t = 6
    causal = np.tril(np.ones((t, t), bool))
    got = np.asarray(pe.cope_positions(jnp.ones((t, t)), causal))
    i, j = np.indices((t, t))
    np.testing.assert_array_equal(got, np.where(causal, i - j + 1, 0))
    hidden = causal.copy()
    hidden[:, 2] = False
    got = np.asarray(pe.cope_positions(jnp.full((t, t), 0.5), hidden))
    np.testing.assert_array_equal(got[5, :3], [2.5, 2.0, 1.5])  # key 2 never counted

  def test_cope_chunked_refuses_naming_the_origin(self):
    mha = aj.MultiHeadAttention(16, 2, causal=True, encoding='cope', max_positions=8,
                                implementation='chunked', rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r"'chunked' cannot serve this call: a dense bias "
                                r'from the contextual positions of cope \(O\(T²\) by nature'):
      nnx.jit(lambda m, x: m(x))(mha, jnp.ones((1, 8, 16)))  # refused while tracing


class CopeInModelsTest(chex.TestCase, parameterized.TestCase):

  def test_cope_cached_decoding_equals_the_full_pass(self):
    """With a random table (the generic test in tests/nn/test_grouped_query.py has the zeros
    of the start), grouped queries, a window (the gates count only what it
    shows) and npos = 3 (positions past the clamp)."""
    enc = pe.make_encoding('cope', d_model=16, num_heads=4, npos=3)
    mha = aj.MultiHeadAttention(16, 4, causal=True, encoding=enc, num_kv_heads=2, sliding_window=6,
                                rngs=nnx.Rngs(0))
    x = jnp.asarray(_normal(1, (2, 12, 16)))
    full = nnx.jit(lambda m, x: m(x))
    without = full(mha, x)
    _random_table(mha.positional, 10)
    want = full(mha, x)
    self.assertGreater(float(jnp.abs(want - without).max()), 1e-2)  # the table matters
    step = nnx.jit(lambda m, x, c, i: m.extend(x, c, i))
    cache, pieces = mha.init_cache(2, 12), []
    for i in range(12):
      out, cache = step(mha, x[:, i:i + 1], cache, jnp.int32(i))
      pieces.append(out)
    chex.assert_trees_all_close(jnp.concatenate(pieces, 1), want, atol=2e-5)

  def test_cope_bfloat16_path(self):
    """bf16 activations: outputs finite and close to the float32 module's; the
    bias is float32, computed from q and k cast to float32 (the same numbers
    as float32 inputs of those values)."""
    x = _normal(1, (2, 7, 16))
    outs = {}
    for dtype in (jnp.float32, jnp.bfloat16):
      mha = aj.MultiHeadAttention(16, 2, causal=True, encoding='cope', max_positions=7, dtype=dtype,
                                  rngs=nnx.Rngs(0))
      _random_table(mha.positional, 4)
      out, weights = nnx.jit(lambda m, x: m(x, return_weights=True))(mha, x.astype(dtype))
      self.assertEqual(out.dtype, dtype)
      self.assertEqual(weights.dtype, jnp.float32)
      chex.assert_tree_all_finite((out, weights))
      outs[dtype] = out
    np.testing.assert_allclose(np.asarray(outs[jnp.bfloat16], np.float32),
                               np.asarray(outs[jnp.float32]), atol=5e-2)
    q, k = (jnp.asarray(_normal(s, (1, 7, 2, 8)), jnp.bfloat16) for s in (5, 6))
    table = mha.positional.pos_emb[...]
    visible = jnp.tril(jnp.ones((7, 7), bool))[None, None]
    bias = jax.jit(pe.cope_bias, static_argnums=4)
    got = bias(q, k, table, visible, 8)
    self.assertEqual(got.dtype, jnp.float32)
    np.testing.assert_array_equal(got, bias(q.astype(jnp.float32), k.astype(jnp.float32),
                                            table, visible, 8))
    self.assertGreater(float(jnp.abs(got).max()), 0.1)

  def test_cope_gradients_reach_the_table_and_the_gates(self):
    """Finite, nonzero gradients to the table e and, through the gates (the
    interpolation weight p − ⌊p⌋; no q·k of the kernel here), to k."""
    q, k = (jnp.asarray(_normal(s, (1, 6, 2, 8))) for s in (9, 10))
    table = jnp.asarray(_normal(7, (8, 7)))
    visible = jnp.tril(jnp.ones((6, 6), bool))[None, None]
    loss = lambda k, table: jnp.sum(jnp.where(
        visible, pe.cope_bias(q, k, table, visible, 7), 0.0) ** 2)
    for g in jax.jit(jax.grad(loss, argnums=(0, 1)))(k, table):
      chex.assert_tree_all_finite(g)
      self.assertGreater(float(jnp.abs(g).max()), 0.0)
    # The derivative in k is the interpolation's slope (no term from ⌊p⌋, ⌈p⌉):
    # central differences agree wherever p stays between the same integers.
    bias = jax.jit(lambda k: pe.cope_bias(q, k, table, visible, 7))
    dk, eps = jnp.asarray(_normal(11, k.shape)), 1e-3
    _, tangent = jax.jvp(bias, (k,), (dk,))
    numeric = (bias(k + eps * dk) - bias(k - eps * dk)) / (2 * eps)
    gates = jax.nn.sigmoid(jnp.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(8))
    p = np.asarray(pe.cope_positions(gates, visible))
    away = np.broadcast_to(np.asarray(visible), p.shape) & (np.abs(p - np.round(p)) > 0.05)
    self.assertGreater(away.sum(), 20)
    np.testing.assert_allclose(np.asarray(tangent)[away], np.asarray(numeric)[away],
                               rtol=1e-2, atol=2e-3)


class CopeConfigTest(parameterized.TestCase):

  def test_cope_table_size(self):
    self.assertEqual(_cope(2, 4, npos=5).pos_emb.shape, (4, 5))
    enc = pe.make_encoding('cope', d_model=8, num_heads=2, max_positions=16)
    self.assertEqual(enc.pos_emb.shape, (4, 17))  # the official block_size + 1
    with self.assertRaisesRegex(ValueError, r'cope needs the size of its position table: '
                                r'npos .* or max_positions'):
      pe.make_encoding('cope', d_model=8, num_heads=2)
    self.assertTrue(pe.CoPE.per_layer)  # one table per layer, as the official code
    np.testing.assert_array_equal(enc.pos_emb[...], 0.0)  # the official zeros

  @parameterized.named_parameters(
      ('cope_npos_zero', dict(npos=0), r'cope: npos=0 must be an integer >= 1'),
      ('cope_npos_float', dict(npos=2.5), r'cope: npos=2.5 must be an integer'),
      ('cope_npos_bool', dict(npos=True), r'cope: npos=True must be an integer'),
      ('cope_nodiv', dict(nodiv='yes'), r"cope: nodiv='yes' must be True or False"),
      ('cope_max_positions', dict(max_positions=3.5), r'cope: max_positions=3.5 must be'))
  def test_cope_bad_options_name_the_key(self, options, message):
    with self.assertRaisesRegex(ValueError, message):
      pe.make_encoding('cope', d_model=8, num_heads=2, **options)

  def test_cope_unknown_option(self):
    with self.assertRaisesRegex(ValueError, r"'cope' got an unknown option among \['p_max'\]"):
      pe.make_encoding('cope', d_model=8, num_heads=2, max_positions=8, p_max=8)

  def test_cope_lab_config_validates(self):
    config = resolve_options(copy_config.get_config('encoding=cope,scale=tiny'))
    self.assertIsNone(config.model.encoding_options.cope.npos)
    validate.validate_config(config)
    config.model.encoding_options.cope.npos = 5
    validate.validate_config(config)
    config.model.attention_implementation = 'chunked'  # O(T²): refused before training
    with self.assertRaisesRegex(validate.ConfigError, "'chunked' with 'cope': .*contextual "
                                'positions of cope'):
      validate.validate_config(config)
    config.model.attention_implementation = 'auto'
    config.model.encoding_options.cope.n_pos = 8
    with self.assertRaisesRegex(validate.ConfigError,
                                r'model\.encoding_options\.cope\.n_pos: .*npos'):
      validate.validate_config(config)


if __name__ == '__main__':
  absltest.main()
