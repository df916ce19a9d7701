"""Greedy decoding through the key/value cache, for any model with the
cache protocol: `init_cache(batch_size, cache_size) -> cache` and
`extend(tokens [B, S], cache, start, *, positions=None) -> (logits [B, S, V],
cache)` (`TransformerLM` has it)."""

from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx


PROTOCOL = ('init_cache(batch_size, cache_size) -> cache and extend(tokens [B, S], cache, '
            'start, *, positions=None) -> (logits [B, S, V], cache)')


def check_cache_protocol(model, caller: str) -> None:
  """TypeError naming the methods `caller` needs if `model` lacks them."""
  missing = [m for m in ('init_cache', 'extend') if not callable(getattr(model, m, None))]
  if missing:
    raise TypeError(f'{caller} decodes with a key/value cache: the model needs {PROTOCOL}, '
                    f'as TransformerLM has; {type(model).__name__} has no '
                    f'{" or ".join(missing)}.')


def _extend(model, tokens, cache, start, positions):
  if positions is None:  # a model of its own may take no positions
    return model.extend(tokens, cache, start)
  return model.extend(tokens, cache, start, positions=positions)


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
  b, t = inputs.shape
  if positions is not None:
    positions = jnp.broadcast_to(jnp.asarray(positions, jnp.int32), (b, t))
  # Prefill with every token: slots past a row's prompt hold teacher-forced
  # keys until decoding rewrites them, and `extend`'s causal mask hides every
  # slot past the query, so none is read before it is rewritten.
  logits, cache = _extend(model, inputs, model.init_cache(b, t), 0, positions)
  predictions = jnp.argmax(logits, -1).astype(jnp.int32)
  first = jnp.clip(jnp.min(prompt_lengths) - 1, 0, t)
  stop = t if stop is None else jnp.clip(stop, first, t)
  graphdef, state = nnx.split(model)  # a pure loop body: merge inside

  def step(i, carry):
    cache, predictions = carry
    previous = jax.lax.dynamic_index_in_dim(predictions, jnp.maximum(i - 1, 0), 1, False)
    token = jnp.where(i < prompt_lengths, inputs[:, i], previous)
    pos = None if positions is None else jax.lax.dynamic_slice_in_dim(positions, i, 1, 1)
    # Slot i of a cache of t slots, i < t: in range by construction (the
    # traced check costs a few scalar operations).
    logits, cache = _extend(nnx.merge(graphdef, state), token[:, None], cache, i, pos)
    prediction = jnp.argmax(logits, -1).astype(jnp.int32)
    return cache, jax.lax.dynamic_update_slice_in_dim(predictions, prediction, i, 1)

  _, predictions = jax.lax.fori_loop(first, stop, step, (cache, predictions))
  return jnp.where(jnp.arange(t) < stop, predictions, 0)


def generate(model, prompt: jax.Array, num_tokens: int, *,
             positions: Optional[jax.Array] = None) -> jax.Array:
  """Greedy generation with the key/value cache.

  Args:
    model: a `TransformerLM`, or any model with the cache protocol (module
      docstring); a TypeError naming the methods otherwise.
    prompt: int `[B, P]`, P >= 1 tokens.
    num_tokens: how many tokens to append.
    positions: optional int `[P + num_tokens]` or `[B, P + num_tokens]` for
      the encoding (default 0 … P+num_tokens-1).

  Returns:
    int32 `[B, P + num_tokens]`: the prompt, then at each step the argmax of
    the logits after the tokens so far — what re-running the model on the
    growing sequence would pick.
  """
  check_cache_protocol(model, 'generate')
  prompt = jnp.asarray(prompt, jnp.int32)
  if prompt.ndim != 2 or prompt.shape[1] < 1:
    raise ValueError(f'prompt must be int [batch, length >= 1], got shape {prompt.shape}.')
  if num_tokens < 0:
    raise ValueError(f'num_tokens must be >= 0, got {num_tokens}.')
  (b, p), total = prompt.shape, prompt.shape[1] + num_tokens
  if num_tokens == 0:
    return prompt
  # Greedy decoding of the prompt padded to `total`: prediction t is token t+1.
  padded = jnp.concatenate([prompt, jnp.zeros((b, num_tokens), jnp.int32)], axis=1)
  predictions = greedy_predictions(model, padded, jnp.full((b,), p, jnp.int32), positions,
                                   stop=total - 1)
  return jnp.concatenate([prompt, predictions[:, p - 1:total - 1]], axis=1)
