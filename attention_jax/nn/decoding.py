"""Decoding through the key/value cache, greedy or sampled (`nn.sampling`),
for any model with the cache protocol: `init_cache(batch_size, cache_size)
-> cache` and `extend(tokens [B, S], cache, start, *, positions=None) ->
(logits [B, S, V], cache)` (`TransformerLM` has it)."""

from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention.checks import check_array
from attention_jax.nn.cache import is_static
from attention_jax.nn.sampling import check_sampling_options
from attention_jax.nn.sampling import options_valid
from attention_jax.nn.sampling import sample_tokens
from attention_jax.nn.sampling import static_int


PROTOCOL = ('init_cache(batch_size, cache_size) -> cache and extend(tokens [B, S], cache, '
            'start, *, positions=None) -> (logits [B, S, V], cache)')


def check_cache_protocol(model, caller: str) -> None:
  """TypeError naming the methods `caller` needs if `model` lacks them."""
  missing = [m for m in ('init_cache', 'extend') if not callable(getattr(model, m, None))]
  if missing:
    raise TypeError(f'{caller} decodes with a key/value cache: the model needs {PROTOCOL}, '
                    f'as TransformerLM has; {type(model).__name__} has no '
                    f'{" or ".join(missing)}.')


def _extend(model, tokens, cache, start, positions, segment_ids=None):
  # A model of its own may take neither: each is passed only when given.
  given = {k: v for k, v in (('positions', positions), ('segment_ids', segment_ids))
           if v is not None}
  return model.extend(tokens, cache, start, **given)


def greedy_predictions(model, inputs: jax.Array,
                       prompt_lengths: jax.Array,
                       positions: Optional[jax.Array] = None, *,
                       stop: Optional[jax.Array] = None) -> jax.Array:
  """Greedy decoding through `model.extend` (any model with the cache
  protocol, module docstring), rows with their own prompt lengths.

  Position t reads `inputs[:, t]` while t < prompt_lengths (int `[B]`), else
  the prediction at t-1, and predicts token t+1. Returns int32 `[B, T]`;
  under teacher forcing the same predictions would come from `model(inputs)`
  wherever every earlier prediction was right.

  The prompt part all rows share is read in one pass (prefill); only the
  rest is decoded token by token, up to `stop` (int, may be traced; default
  T): positions from `stop` on are left 0, for callers that know where every
  row ends.
  """
  check_cache_protocol(model, 'greedy_predictions')
  t = inputs.shape[1]
  predictions, stop = decode(model, inputs, prompt_lengths, positions,
                             stop=t if stop is None else stop, choose=_argmax)
  return jnp.where(jnp.arange(t) < stop, predictions, 0)


def _argmax(logits, i):  # pylint: disable=unused-argument
  return jnp.argmax(logits, -1).astype(jnp.int32)


def decode(model, inputs: jax.Array, prompt_lengths: jax.Array,
           positions: Optional[jax.Array], *, stop, choose: Callable,
           ends: Optional[jax.Array] = None,
           eos_id: Optional[int] = None,
           segment_ids: Optional[jax.Array] = None) -> tuple[jax.Array, jax.Array]:
  """The decoding loop of `greedy_predictions` and `generate`.

  inputs int `[B, T]`, prompt_lengths int `[B]`, positions None, `[T]` or
  `[B, T]`, segment_ids None or int `[B, T]` (every slot's document: a
  row still reading its prompt keeps the prompt's ids);
  `choose(logits [B, V], t) -> int32 [B]` picks the token that
  position t predicts. The loop runs from the shortest prompt's last
  position up to `stop` (clipped to it … T), and ends earlier once every
  row is finished: it has predicted slot `ends - 1` (int `[B]`), or a token
  `eos_id` after its prompt. Returns (predictions int32 `[B, T]`, prediction
  t the token for slot t+1, read only where the loop reached; the clipped
  stop).
  """
  b, t = inputs.shape
  if positions is not None:
    positions = jnp.broadcast_to(jnp.asarray(positions, jnp.int32), (b, t))
  # Prefill with every token: slots past a row's prompt hold teacher-forced
  # keys until decoding rewrites them, and `extend`'s causal mask hides every
  # slot past the query, so none is read before it is rewritten.
  logits, cache = _extend(model, inputs, model.init_cache(b, t), 0, positions, segment_ids)
  predictions = jnp.argmax(logits, -1).astype(jnp.int32)
  first = jnp.clip(jnp.min(prompt_lengths) - 1, 0, t)
  stop = jnp.clip(stop, first, t)
  graphdef, state = nnx.split(model)  # a pure loop body: merge inside

  def step(carry):
    i, cache, predictions, finished = carry
    previous = jax.lax.dynamic_index_in_dim(predictions, jnp.maximum(i - 1, 0), 1, False)
    token = jnp.where(i < prompt_lengths, inputs[:, i], previous)
    pos = None if positions is None else jax.lax.dynamic_slice_in_dim(positions, i, 1, 1)
    # A row may still be reading its prompt at slot i: the slot keeps its id.
    ids = None if segment_ids is None else jax.lax.dynamic_slice_in_dim(segment_ids, i, 1, 1)
    # Slot i of a cache of t slots, i < t: in range by construction (the
    # traced check costs a few scalar operations).
    logits, cache = _extend(nnx.merge(graphdef, state), token[:, None], cache, i, pos, ids)
    prediction = choose(logits[:, 0], i)
    if ends is not None:
      finished |= i + 1 >= ends - 1
    if eos_id is not None:
      finished |= (i + 1 >= prompt_lengths) & (prediction == eos_id)
    return (i + 1, cache, jax.lax.dynamic_update_slice_in_dim(predictions, prediction[:, None],
                                                              i, 1), finished)

  def more(carry):
    i, _, _, finished = carry
    return (i < stop) & ~jnp.all(finished)

  carry = (first, cache, predictions, jnp.zeros((b,), bool))
  _, _, predictions, _ = jax.lax.while_loop(more, step, carry)
  return predictions, stop


def generate(model, prompt: jax.Array, num_tokens: int, *,
             positions: Optional[jax.Array] = None,
             prompt_lengths: Optional[jax.Array] = None,
             key: Optional[jax.Array] = None, temperature=None,
             top_k: Optional[int] = None, top_p=None,
             eos_id: Optional[int] = None, pad_id: int = 0,
             segment_ids: Optional[jax.Array] = None) -> jax.Array:
  """Generation with the key/value cache: greedy by default, or sampled.

  Greedy or sampled, one rule: without `key` every token is the argmax of
  the logits (ties: the lower id), and giving `temperature`, `top_k` or
  `top_p` without a key is a ValueError; with `key` tokens are drawn
  (`nn.sampling`: temperature, then top-k, then top-p, in float32), and
  temperature 0 is again the argmax.

  Args:
    model: a `TransformerLM`, or any model with the cache protocol (module
      docstring); a TypeError naming the methods otherwise.
    prompt: int `[B, P]`, P >= 1 tokens; with `prompt_lengths`, row b's
      prompt is `prompt[b, :prompt_lengths[b]]` and the rest of the row
      any token ids (padding, never read as a token of the row).
    num_tokens: how many tokens each row gets after its prompt (a Python
      int >= 0: it sizes the output).
    positions: optional int `[P + num_tokens]` or `[B, P + num_tokens]` for
      the encoding, by slot (default 0 … P+num_tokens-1).
    prompt_lengths: optional int `[B]`, each in 1 … P (default P): rows of
      different lengths, right-padded to P. May be traced.
    key: a `jax.random.key`, or one per row `[B]`; a single key gives row b
      `jax.random.split(key, B)[b]`, so row b equals generating its prompt
      alone with that key in a batch of one (`key=keys[b:b+1]`). The token
      for slot s of a row is drawn with `jax.random.fold_in(row_key, s - 1)`.
      (Flax's Gemma sampler folds the step into one key for the whole
      batch, so there a row's draws depend on the rows beside it.)
    temperature: >= 0, may be traced (default 1 with a key); 0 is greedy.
    top_k: a Python int in 1 … vocab_size (static), or None (all tokens).
    top_p: in (0, 1], may be traced, or None (1: all tokens).
    eos_id: optional token id in 0 … vocab_size-1: a row's tokens after the
      first `eos_id` it generates are `pad_id`; the other rows go on, and
      decoding stops once every row has generated it (or its num_tokens).
      An `eos_id` inside a prompt ends nothing, as in Hugging Face (Flax's
      Gemma sampler pads after the first EOS anywhere, prompt included).
    pad_id: the token id after a row's end (default 0), in 0 … vocab_size-1.
    segment_ids: optional int `[B, P]`, a packed prompt: several documents
      per row, each attending only to itself at positions restarting at 0
      (`TransformerLM(…, segment_ids=)`); the generated tokens continue the
      row's last document (the one of its last prompt token), so a row
      generates what its last document alone would. Not with `positions`.

  Returns:
    int32 `[B, P + num_tokens]`: row b holds its prompt, then its
    num_tokens tokens (up to and including its first `eos_id`), then
    `pad_id`: what re-running the model on the growing sequence of that row
    alone would pick or, sampled, draw with the same keys. Without
    `prompt_lengths` and `eos_id`: the prompt and num_tokens tokens.

  Under `jit` (static: num_tokens, top_k, eos_id, pad_id; traced:
  temperature, top_p, prompt_lengths, key) a traced value cannot be
  checked: an invalid temperature or top_p makes every generated token -1,
  an invalid prompt length its whole row (-1 is no token id, so such output
  cannot pass for a sample). Everything else is refused with a ValueError
  or TypeError before decoding; so is a cache of P + num_tokens slots that
  the model's positions cannot serve (a learned table, with default
  positions).
  """
  check_cache_protocol(model, 'generate')
  prompt = _check_prompt(prompt)
  num_tokens = _check_num_tokens(num_tokens)
  sampling = (temperature, top_k, top_p) != (None, None, None)
  if key is None and sampling:
    given = ', '.join(f'{n}={v!r}' for n, v in (('temperature', temperature), ('top_k', top_k),
                                                 ('top_p', top_p)) if v is not None)
    raise ValueError(f'generate: {given} samples, which needs key= (a jax.random.key, or '
                     'one per row); without a key generation is greedy and takes no '
                     'temperature, top_k or top_p.')
  (b, p), total = prompt.shape, prompt.shape[1] + num_tokens
  if positions is not None:
    positions = check_array('positions', positions, ndim=(1, 2), kind='integer')
    if positions.shape[-1] != total or positions.ndim == 2 and positions.shape[0] not in (1, b):
      raise ValueError(f'positions must be int [P + num_tokens] = [{total}] or [B|1, {total}] '
                       f'(one per slot), got shape {tuple(positions.shape)}.')
  if temperature is None and key is not None:
    temperature = 1.0
  top_k = check_sampling_options(temperature, top_k, top_p)
  pad_id = _check_token_id('pad_id', pad_id, None)
  if top_k is not None or eos_id is not None or pad_id != 0:
    vocab = _vocab_size(model, prompt, positions)
    check_sampling_options(top_k=top_k, vocab_size=vocab)
    eos_id = _check_token_id('eos_id', eos_id, vocab)
    _check_token_id('pad_id', pad_id, vocab)
  lengths, rows_valid = _check_prompt_lengths(prompt_lengths, b, p)
  documents = _prompt_documents(segment_ids, positions, lengths, b, p, total)
  row_keys = None if key is None else _row_keys(key, b)
  slots = jnp.arange(total)[None, :]
  if num_tokens == 0:
    if prompt_lengths is None:
      return prompt
    tokens = jnp.where(slots < lengths[:, None], prompt, pad_id)
    return jnp.where(rows_valid[:, None], tokens, -1).astype(jnp.int32)

  def choose(logits, i):
    if row_keys is None:
      return _argmax(logits, i)
    sample = lambda k, row: sample_tokens(jax.random.fold_in(k, i), row,
                                          temperature=temperature, top_k=top_k, top_p=top_p)
    return jax.vmap(sample)(row_keys, logits)

  # Decoding the prompt padded to `total`: prediction t is the token for slot t+1.
  padded = jnp.concatenate([prompt, jnp.zeros((b, num_tokens), jnp.int32)], axis=1)
  ends = lengths + num_tokens
  predictions, _ = decode(model, padded, lengths, positions, stop=jnp.max(ends) - 1,
                          choose=choose, ends=ends, eos_id=eos_id, segment_ids=documents)
  shifted = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), predictions[:, :-1]], axis=1)
  in_prompt = slots < lengths[:, None]
  generated = ~in_prompt & (slots < ends[:, None])
  if eos_id is not None:  # up to and including the first EOS after the prompt
    eos = generated & (shifted == eos_id)
    last = jnp.where(jnp.any(eos, 1), jnp.argmax(eos, 1), total)
    generated &= slots <= last[:, None]
  tokens = jnp.where(generated, shifted, pad_id)
  tokens = jnp.where(options_valid(temperature, top_p), tokens, -1)
  tokens = jnp.where(in_prompt, padded, tokens)
  return jnp.where(rows_valid[:, None], tokens, -1).astype(jnp.int32)


def _prompt_documents(segment_ids, positions, lengths, b: int, p: int, total: int):
  """`generate`'s packed prompt: int32 `[B, total]`, the prompt's ids, then
  every later slot in the document of the row's last prompt token; None
  without `segment_ids`."""
  if segment_ids is None:
    return None
  if positions is not None:
    raise ValueError('generate: segment_ids= sets each token\'s position (its index in its '
                     'document); give positions= or segment_ids=, not both.')
  ids = check_array('segment_ids', segment_ids, ndim=2, kind='integer')
  if ids.shape != (b, p):
    raise ValueError(f'segment_ids must be int [B, P] = [{b}, {p}] like the prompt, got '
                     f'shape {tuple(ids.shape)}.')
  ids = jnp.asarray(ids, jnp.int32)
  last = jnp.take_along_axis(ids, jnp.clip(lengths - 1, 0, p - 1)[:, None], axis=1)
  slots = jnp.arange(total)[None, :]
  padded = jnp.concatenate([ids, jnp.broadcast_to(last, (b, total - p))], axis=1)
  return jnp.where(slots < lengths[:, None], padded, last)


def _check_prompt(prompt) -> jax.Array:
  prompt = prompt if isinstance(prompt, jax.Array) else np.asarray(prompt)
  if prompt.ndim != 2 or prompt.shape[1] < 1:
    raise ValueError(f'prompt must be int [batch, length >= 1], got shape {prompt.shape}.')
  if not jnp.issubdtype(prompt.dtype, jnp.integer):
    example = ('' if not (is_static(prompt) and prompt.size)
               else f' (e.g. {np.asarray(prompt).ravel()[0].item():g})')
    raise TypeError(f'prompt must be int token ids [batch, length], got dtype '
                    f'{prompt.dtype}{example}; a float is not truncated to an id: cast '
                    'it yourself if that is what you mean.')
  return jnp.asarray(prompt, jnp.int32)


def _check_num_tokens(num_tokens) -> int:
  num_tokens = static_int('num_tokens', num_tokens,
                          'a Python int >= 0 (static: it sizes the output)')
  if num_tokens < 0:
    raise ValueError(f'num_tokens must be >= 0, got {num_tokens}.')
  return int(num_tokens)


def _check_token_id(name: str, value, vocab: Optional[int]) -> Optional[int]:
  """`value` as an int (None stays None), or an error naming it; the
  vocabulary's upper end is checked when `vocab` is known."""
  if value is None:
    return None
  value = static_int(name, value, 'a Python int token id (static)')
  if value < 0 or (vocab is not None and value >= vocab):
    upper = '' if vocab is None else f' … {vocab - 1} (vocab_size={vocab})'
    raise ValueError(f'{name}={value} is outside the vocabulary 0{upper}.')
  return value


def _vocab_size(model, prompt, positions) -> int:
  """V of the model's logits, from a trace of one cached step (nothing runs)."""
  pos = None if positions is None else jnp.zeros((prompt.shape[0], 1), jnp.int32)
  shape = jax.eval_shape(lambda tokens: _extend(model, tokens, model.init_cache(
      tokens.shape[0], 1), 0, pos)[0], jax.ShapeDtypeStruct((prompt.shape[0], 1), jnp.int32))
  return shape.shape[-1]


def _check_prompt_lengths(prompt_lengths, b: int, p: int) -> tuple[jax.Array, jax.Array]:
  """(lengths int32 `[B]`, rows valid bool `[B]`): a known length outside
  1 … P is a ValueError, a traced one marks its row invalid."""
  if prompt_lengths is None:
    return jnp.full((b,), p, jnp.int32), jnp.ones((b,), bool)
  lengths = jnp.asarray(prompt_lengths)
  if lengths.shape != (b,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
    raise ValueError(f'prompt_lengths must be int [batch] = [{b}], got shape '
                     f'{lengths.shape} and dtype {lengths.dtype}.')
  if is_static(lengths):
    bad = np.asarray(lengths)[(np.asarray(lengths) < 1) | (np.asarray(lengths) > p)]
    if bad.size:
      raise ValueError(f'prompt_lengths holds {int(bad[0])}: each must be in 1 … {p} (the '
                       f'prompt has {p} columns).')
  lengths = lengths.astype(jnp.int32)
  return lengths, (lengths >= 1) & (lengths <= p)


def _row_keys(key, b: int) -> jax.Array:
  """One key per row `[B]` from a key `[]` (split) or `[B]`."""
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    raise TypeError(f'key must be a jax.random.key (a typed key array), got dtype '
                    f'{key.dtype} and shape {key.shape}; jax.random.wrap_key_data turns '
                    'raw uint32 key data into one.')
  if key.shape == ():
    return jax.random.split(key, b)
  if key.shape != (b,):
    raise ValueError(f'key must be one jax.random.key (shape ()) or one per row (shape '
                     f'({b},)), got shape {key.shape}.')
  return key
