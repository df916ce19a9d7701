"""String tasks: reverse_string, stack_manipulation (deterministic context-
free), duplicate_string, odds_first, bucket_sort, missing_duplicate_string
(context-sensitive), following google-deepmind/randomized_positional_encodings
`tasks/dcf/{reverse_string,stack_manipulation}.py`, `tasks/cs/
{duplicate_string,odds_first,bucket_sort,missing_duplicate_string}.py` and
`experiments/constants.py` (vocabulary 2 for reverse, duplicate and
odds_first, 5 for bucket_sort).

Where their docstring and code disagree, the code wins: odds_first's
docstring puts s_1 s_3 … (1-based odd) first, its code `x[:, 1::2]` then
`x[:, ::2]` puts the 0-based odd indices first: s_2 s_4 … s_1 s_3 ….
bucket_sort's sampler docstring says "sorted by (inc.) occurrence"; its code
sorts by symbol value (`jnp.sort`), as here.

Each `label_*` maps an input `x` int32 `[B, N]` with `n` real symbols
(traced) to the output int32 `[B, output_length(N)]`, zeros past
output_length(n).
"""

import jax
import jax.numpy as jnp

from attention_jax.lab.tasks.chomsky.regular import real
from attention_jax.lab.tasks.chomsky.regular import uniform_symbols
from attention_jax.lab.tasks.spec import TaskSpec
from attention_jax.lab.tasks.spec import one_output
from attention_jax.lab.tasks.spec import same_length

POP, PUSH_0, PUSH_1 = 2, 3, 4  # stack_manipulation's actions
TERMINATOR = 2  # stack_manipulation's end-of-stack class (their output_size - 1)
GAP, FILL = 2, 3  # missing_duplicate_string's hidden symbol and odd-length padding


def _gather(x, index, keep):
  """x[b, index[b, j]] where keep, else 0; index clipped into range."""
  index = jnp.clip(index, 0, x.shape[1] - 1)
  return jnp.where(keep, jnp.take_along_axis(x, jnp.broadcast_to(index, keep.shape), 1), 0)


def _positions(batch_size, width):
  return jnp.broadcast_to(jnp.arange(width)[None, :], (batch_size, width))


def label_reverse(x, n):
  """`jnp.flip(x)` of the real part."""
  j = _positions(x.shape[0], x.shape[1])
  return _gather(x, n - 1 - j, j < n)


def label_duplicate(x, n):
  """x x: output `[B, 2N]`."""
  j = _positions(x.shape[0], 2 * x.shape[1])
  return _gather(x, j % jnp.maximum(n, 1), j < 2 * n)


def label_odds_first(x, n):
  """`x[1::2]` then `x[::2]` (0-based odd indices first: their code)."""
  j = _positions(x.shape[0], x.shape[1])
  odds = n // 2
  return _gather(x, jnp.where(j < odds, 2 * j + 1, 2 * (j - odds)), j < n)


def label_bucket_sort(x, n, vocab: int = 5):
  """The real symbols in increasing order."""
  keep = real(x, n)
  return jnp.where(keep, jnp.sort(jnp.where(keep, x, vocab), axis=1), 0).astype(jnp.int32)


def label_stack(x, n):
  """Pushes each stack bit (a token < 2), then runs the actions (POP ignored
  on an empty stack); the final stack top-first, the terminator, zeros:
  `[B, N + 1]`."""
  b, big = x.shape

  def step(carry, p):
    stack, top = carry
    token = x[:, p]
    live = p < n
    push = live & (token != POP)
    value = jnp.where(token < 2, token, token - PUSH_0)
    stack = jnp.where(push[:, None] & (jnp.arange(big)[None] == top[:, None]),
                      value[:, None], stack)
    top = jnp.where(push, top + 1, jnp.where(live & (token == POP), jnp.maximum(top - 1, 0), top))
    return (stack, top), None

  (stack, top), _ = jax.lax.scan(step, (jnp.zeros((b, big), jnp.int32),
                                        jnp.zeros((b,), jnp.int32)), jnp.arange(big))
  j = _positions(b, big + 1)
  top = top[:, None]
  popped = jnp.pad(stack, ((0, 0), (0, 1)))
  return jnp.where(j < top, _gather(popped, top - 1 - j, j < top),
                   jnp.where(j == top, TERMINATOR, 0)).astype(jnp.int32)


def sample_stack(key, n, batch_size, max_length):
  """Their `_sample_expression_and_result`: length 1 is one stack bit; else
  a stack of `randint(1, n)` bits (NumPy: 1 … n - 1), then actions uniform
  in {POP, PUSH 0, PUSH 1}."""
  k_len, k_bits, k_act = jax.random.split(key, 3)
  stack_length = jax.random.randint(k_len, (batch_size, 1), 1, jnp.maximum(n, 2), jnp.int32)
  stack_length = jnp.where(n == 1, 1, stack_length)
  bits = jax.random.randint(k_bits, (batch_size, max_length), 0, 2, jnp.int32)
  actions = jax.random.randint(k_act, (batch_size, max_length), POP, PUSH_1 + 1, jnp.int32)
  p = jnp.arange(max_length)[None, :]
  return jnp.where(p < stack_length, bits, jnp.where(p < n, actions, 0)).astype(jnp.int32)


def label_missing_duplicate(x, n):
  """The hidden symbol: the other copy's symbol at the gap (length 1: 1)."""
  half = n // 2
  gap = jnp.argmax(x == GAP, axis=1)[:, None]
  partner = jnp.where(gap < half, gap + half, gap - half)
  found = jnp.take_along_axis(x, jnp.clip(partner, 0, x.shape[1] - 1), axis=1)
  return jnp.where(n == 1, 1, found).astype(jnp.int32)


def sample_missing_duplicate(key, n, batch_size, max_length):
  """Their sampler: bits of length n // 2 twice, one symbol (uniform over
  the 2·(n // 2)) replaced by the gap, the fill token if n is odd; at
  length 1 the input is `[1]`."""
  k_bits, k_gap = jax.random.split(key)
  half = n // 2
  bits = jax.random.randint(k_bits, (batch_size, max_length), 0, 2, jnp.int32)
  p = jnp.arange(max_length)[None, :]
  twice = jnp.take_along_axis(bits, jnp.broadcast_to(p % jnp.maximum(half, 1),
                                                     bits.shape), axis=1)
  gap = jax.random.randint(k_gap, (batch_size, 1), 0, jnp.maximum(2 * half, 1), jnp.int32)
  x = jnp.where(p == gap, GAP, twice)
  x = jnp.where(p < 2 * half, x, jnp.where(p < n, FILL, 0))
  return jnp.where(n == 1, jnp.where(p < 1, 1, 0), x).astype(jnp.int32)


def _task(name, level, vocab, output_size, label, output_length, sample=None,
          terminated=False):
  def generate(key, n, batch_size, max_length):
    if sample is None:
      x = uniform_symbols(key, n, batch_size, max_length, vocab)
    else:
      x = sample(key, n, batch_size, max_length)
    return x, label(x, n)
  return TaskSpec(name, level, vocab, output_size, generate, output_length=output_length,
                  terminated=terminated)


TASKS = {
    'reverse_string': _task('reverse_string', 'context_free', 2, 2, label_reverse,
                            same_length),
    'stack_manipulation': _task('stack_manipulation', 'context_free', 5, 3, label_stack,
                                lambda n: n + 1, sample_stack, terminated=True),
    'duplicate_string': _task('duplicate_string', 'context_sensitive', 2, 2, label_duplicate,
                              lambda n: 2 * n),
    'missing_duplicate_string': _task('missing_duplicate_string', 'context_sensitive', 4, 2,
                                      label_missing_duplicate, one_output,
                                      sample_missing_duplicate),
    'odds_first': _task('odds_first', 'context_sensitive', 2, 2, label_odds_first,
                        same_length),
    'bucket_sort': _task('bucket_sort', 'context_sensitive', 5, 5, label_bucket_sort,
                         same_length),
}
