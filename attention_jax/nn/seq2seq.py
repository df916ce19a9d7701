"""RNN encoder-decoder, with or without Bahdanau attention (lesson 7.1).

* `attention=False`: the classic bottleneck. The decoder starts from the
  encoder's final state (at each sequence's last real token) and never sees
  any other encoder state.
* `attention=True`: Bahdanau et al. (2015). At every step the decoder's
  previous state s_{i-1} scores all encoder states, and the context c_i feeds
  the GRU input and the readout: s_i = GRU(s_{i-1}, [emb(y_{i-1}); c_i]),
  logits_i = W [s_i; c_i].

GRU cells run under `nnx.RNN` (encoder) and `nnx.scan` (decoder): no Python
loop over time. Training uses teacher forcing; `greedy_decode` feeds back the
model's own argmax.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax.attention.checks import check_count
from attention_jax.nn.arguments import check_constructor
from attention_jax.nn.additive import SCORES
from attention_jax.nn.additive import AdditiveAttention
from attention_jax.nn.layers import linear
from attention_jax.positional.parameters import EMBED
from attention_jax.positional.parameters import MLP
from attention_jax.positional.parameters import VOCAB
from attention_jax.positional.parameters import annotate
from attention_jax.positional.parameters import annotation
from attention_jax.positional.parameters import check_dtypes


class Seq2Seq(nnx.Module):
  """GRU encoder-decoder: source tokens `[B, N]` -> target logits `[B, M, vocab]`.

  Args:
    vocab_size: token ids (source and target share the vocabulary).
    embed_dim, hidden_dim: embedding and GRU widths.
    attention: add Bahdanau attention over the encoder states.
    start_token: the id the decoder starts from (the target's BOS).
    bidirectional: a forward and a backward GRU encoder, concatenated.
    score: 'additive' (Bahdanau) or 'dot' (Luong) attention score.
    dtype: computation dtype of every layer (Flax's; None: inferred from the
      inputs and parameters); attention's scores and softmax stay float32,
      the logits are float32 whatever it is.
    param_dtype: storage of every parameter; default float32.
    rngs: `nnx.Rngs` for the parameters.
  """

  def __init__(self, *, vocab_size: int, embed_dim: int, hidden_dim: int,
               attention: bool, start_token: int, bidirectional: bool = False,
               score: str = 'additive', dtype=None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    check_constructor('Seq2Seq', rngs=rngs, counts=(
        ('vocab_size', vocab_size), ('embed_dim', embed_dim), ('hidden_dim', hidden_dim)),
                      flags=(('attention', attention), ('bidirectional', bidirectional)))
    check_count('Seq2Seq', 'start_token', start_token, minimum=0)
    if score not in SCORES:
      raise ValueError(f'Seq2Seq: score={score!r}; choose one of {SCORES}.')
    if start_token >= vocab_size:
      raise ValueError(f'Seq2Seq: start_token={start_token} must be a token id below '
                       f'vocab_size={vocab_size}.')
    dtype, param_dtype = check_dtypes('Seq2Seq', dtype, param_dtype)
    precision = dict(dtype=dtype, param_dtype=param_dtype)
    self.dtype, self.param_dtype = dtype, param_dtype
    self.embed = nnx.Embed(vocab_size, embed_dim, rngs=rngs,
                           embedding_metadata=annotation((VOCAB, EMBED)), **precision)
    # rngs=False: no dropout, so the RNNs hold no random state to mutate.
    forward = nnx.RNN(_gru(embed_dim, hidden_dim, rngs, precision), return_carry=True,
                      rngs=False)
    if bidirectional:
      backward = nnx.RNN(_gru(embed_dim, hidden_dim, rngs, precision),
                         return_carry=True, reverse=True, keep_order=True, rngs=False)
      self.encoder = nnx.Bidirectional(forward, backward, return_carry=True, rngs=False)
    else:
      self.encoder = forward
    self.bidirectional, self.hidden_dim = bidirectional, hidden_dim
    self.start_token = start_token
    encoder_dim = hidden_dim * (2 if bidirectional else 1)
    self.bridge = linear(encoder_dim, hidden_dim, (EMBED, MLP), rngs=rngs, **precision)
    context_dim = encoder_dim if attention else 0
    self.decoder_cell = _gru(embed_dim + context_dim, hidden_dim, rngs, precision)
    self.attention = (AdditiveAttention(hidden_dim, encoder_dim, hidden_dim, score=score,
                                        rngs=rngs, **precision) if attention else None)
    self.readout = linear(hidden_dim + context_dim, vocab_size, (EMBED, VOCAB), rngs=rngs,
                          **precision)

  def encode(self, source: jax.Array, source_mask: jax.Array):
    """source `[B, N]`, mask `[B, N]` -> (states `[B, N, E]`, decoder s_0 `[B, H]`)."""
    lengths = source_mask.sum(-1).astype(jnp.int32)
    zeros = jnp.zeros((source.shape[0], self.hidden_dim), jnp.float32)
    carry, states = self.encoder(
        self.embed(source), seq_lengths=lengths,
        initial_carry=(zeros, zeros) if self.bidirectional else zeros)
    if self.bidirectional:
      carry = jnp.concatenate(carry, axis=-1)
    return states, jnp.tanh(self.bridge(carry))

  def _step(self, state, token_embedding, memory):
    """One decoder step from s_{i-1}; returns (s_i, logits_i, weights_i)."""
    states, keys_proj, mask = memory
    if self.attention is None:
      new_state, _ = self.decoder_cell(state, token_embedding)
      return new_state, self.readout(new_state), None
    context, weights = self.attention(state, states, mask=mask, keys_proj=keys_proj)
    new_state, _ = self.decoder_cell(state, jnp.concatenate([token_embedding, context], -1))
    return new_state, self.readout(jnp.concatenate([new_state, context], -1)), weights

  def _memory(self, states, source_mask):
    keys_proj = self.attention.project_keys(states) if self.attention else None
    return states, keys_proj, source_mask

  def __call__(self, source, source_mask, decoder_inputs, *, return_weights: bool = False):
    """Teacher-forced logits float32 `[B, M, vocab]` for decoder_inputs `[B, M]`
    (and attention weights `[B, M, N]` with `return_weights`)."""
    states, state = self.encode(source, source_mask)
    return self.decode(states, state, source_mask, decoder_inputs,
                       return_weights=return_weights)

  def decode(self, states, state, source_mask, decoder_inputs, *,
             return_weights: bool = False):
    """Teacher-forced decoding from encoder `states` `[B, N, E]` and initial
    decoder state `[B, H]`; see `__call__`. Without attention `states` is
    unused: the decoder's only view of the source is `state`."""
    memory = self._memory(states, source_mask)

    @nnx.scan(in_axes=(None, nnx.Carry, 1, None), out_axes=(nnx.Carry, 1))
    def run(model, state, embedding, memory):
      state, logits, weights = model._step(state, embedding, memory)  # pylint: disable=protected-access
      return state, (logits, weights)

    _, (logits, weights) = run(self, state, self.embed(decoder_inputs), memory)
    logits = logits.astype(jnp.float32)
    return (logits, weights) if return_weights else logits

  def greedy_decode(self, source, source_mask, num_steps: int,
                    return_weights: bool = False):
    """Feeds back its own argmax from BOS for `num_steps` steps ->
    int32 predictions `[B, num_steps]` (and weights `[B, num_steps, N]`)."""
    states, state = self.encode(source, source_mask)
    memory = self._memory(states, source_mask)
    first = jnp.full(source.shape[:1], self.start_token, jnp.int32)

    @nnx.scan(in_axes=(None, nnx.Carry, None), out_axes=(nnx.Carry, 1), length=num_steps)
    def run(model, carry, memory):
      state, token = carry
      state, logits, weights = model._step(state, model.embed(token), memory)  # pylint: disable=protected-access
      token = jnp.argmax(logits, -1).astype(jnp.int32)
      return (state, token), (token, weights)

    _, (tokens, weights) = run(self, (state, first), memory)
    return (tokens, weights) if return_weights else tokens


def _gru(d_in: int, hidden: int, rngs, precision) -> nnx.GRUCell:
  """`nnx.GRUCell` (which takes no metadata) with its parameters' axes named."""
  cell = nnx.GRUCell(d_in, hidden, rngs=rngs, recurrent_kernel_init=_orthogonal_in_float32,
                     **precision)
  for dense in (cell.dense_i, cell.dense_h):
    annotate(dense.kernel, (EMBED, MLP))
    if dense.bias is not None:
      annotate(dense.bias, (MLP,))
  return cell


def _orthogonal_in_float32(key, shape, dtype=jnp.float32):
  """Flax's GRU recurrent init (orthogonal), drawn in float32 and cast: its QR
  has no bfloat16 or float16 kernel on CPU. The same values for float32."""
  return nnx.initializers.orthogonal()(key, shape, jnp.float32).astype(dtype)
