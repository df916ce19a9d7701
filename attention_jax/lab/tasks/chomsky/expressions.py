"""Arithmetic expressions modulo 5: modular_arithmetic (regular),
modular_arithmetic_brackets and solve_equation (deterministic context-free),
following google-deepmind/randomized_positional_encodings
`tasks/regular/modular_arithmetic.py`, `tasks/dcf/
{modular_arithmetic_brackets,solve_equation}.py` and `experiments/
constants.py` (modulus 5; brackets with `mult=True`; solve_equation's
`sample_batch` does not pass `mult`, so its equations have + and - only).

* modular_arithmetic: an even length becomes odd (n - 1); digits uniform at
  even positions, operators uniform over + * - at odd ones; ids: digits
  0 … 4, + 5, - 6, * 7, their blank 8 (input_size 9). The label is their
  `_evaluate_expression` (subtractions become additions of negated digits,
  products per `+`-separated term with `segment_prod`, the sum mod 5), run on
  the real part padded with blanks, which it reads as `+ 0`.
* brackets: their recursive grammar — length 1 a digit, 2 `-d`, 3 `(d)`,
  4 `(-d)`, longer `(L op R)` with |L| uniform in 1 … n - 4
  (`np.random.randint(1, n - 3)`) and an operator uniform over + - *; ids
  + 5, - 6, * 7, ( 8, ) 9 (input_size 11). Here the tree is drawn top down
  with an explicit stack, one token per step (`sample_grammar`), which is the
  same distribution over strings.
* solve_equation: an expression of length n - 2 from the same grammar with
  + and -; a start index uniform over it, moved right (cyclically) to the
  first digit; that digit replaced by x, then `=` and the expression's value;
  ids + 5, - 6, ( 7, ) 8, x 9, = 10 (input_size 11); the label is the hidden
  digit. Below length 3 the input is zeros and the label 0, as theirs.
"""

import jax
import jax.numpy as jnp

from attention_jax.lab.tasks.spec import TaskSpec

MODULUS = 5
# Abstract tokens of the grammar (mapped to each task's ids by `*_IDS`).
PLUS, MINUS, TIMES, OPEN, CLOSE = range(MODULUS, MODULUS + 5)
BRACKETS_IDS = {PLUS: 5, MINUS: 6, TIMES: 7, OPEN: 8, CLOSE: 9}
EQUATION_IDS = {PLUS: 5, MINUS: 6, OPEN: 7, CLOSE: 8}
UNKNOWN, EQUALS = 9, 10  # solve_equation's x and =
ARITHMETIC_PLUS, ARITHMETIC_MINUS, ARITHMETIC_TIMES, ARITHMETIC_BLANK = 5, 6, 7, 8


def modular_arithmetic_length(n):
  """Their `if length % 2 != 1: length -= 1`."""
  return n - (1 - n % 2)


def evaluate_arithmetic(expression):
  """Their `_evaluate_expression` on one expression `[L]`, L odd: blanks
  become + or 0, subtractions additions of negated digits, then products per
  term and the sum mod 5 (int32, as theirs)."""
  length = expression.shape[0]
  p = jnp.arange(length)
  blank = expression == ARITHMETIC_BLANK
  e = jnp.where(blank & (p % 2 == 1), ARITHMETIC_PLUS, jnp.where(blank, 0, expression))
  if length >= 2:
    minus = e == ARITHMETIC_MINUS
    e = jnp.where(minus, ARITHMETIC_PLUS, e)
    e = e.at[2:].multiply(1 - 2 * minus[1:-1])
  term_ids = jnp.cumsum(e == ARITHMETIC_PLUS)[::2]
  terms = length // 2 + 1
  products = jax.ops.segment_prod(e[::2], term_ids, num_segments=terms,
                                  indices_are_sorted=True)
  return jnp.sum(products * (jnp.arange(terms) <= term_ids[-1])) % MODULUS


def label_modular_arithmetic(x, n):
  """The value of each expression `[B, 1]` (x `[B, input_length(N)]`)."""
  nx = modular_arithmetic_length(n)
  padded = jnp.where(jnp.arange(x.shape[1])[None] < nx, x, ARITHMETIC_BLANK)
  return jax.vmap(evaluate_arithmetic)(padded)[:, None].astype(jnp.int32)


def sample_modular_arithmetic(key, n, batch_size, max_length):
  """Digits at even positions, operators uniform over + * - at odd ones."""
  width = modular_arithmetic_length(max_length)
  digit_key, op_key = jax.random.split(key)
  digits = jax.random.randint(digit_key, (batch_size, width), 0, MODULUS, jnp.int32)
  ops = jnp.asarray([ARITHMETIC_PLUS, ARITHMETIC_TIMES, ARITHMETIC_MINUS], jnp.int32)[
      jax.random.randint(op_key, (batch_size, width), 0, 3)]
  p = jnp.arange(width)[None]
  x = jnp.where(p % 2 == 0, digits, ops)
  return jnp.where(p < modular_arithmetic_length(n), x, 0).astype(jnp.int32)


def sample_grammar(key, n, batch_size: int, max_length: int, mult: bool):
  """Their `generate_one_expression_and_result(modulus, n, mult)` strings,
  abstract tokens `[B, max_length]` (zeros past n; n >= 1 traced). A stack of
  pending items (a node's length >= 0, or a literal token t as -1 - t) is
  expanded one written token per step, in the order their recursion writes."""
  depth = max_length + 4

  def literal(t):
    return -1 - t

  def step(i, state):
    stack, top, out = state
    k = jax.random.fold_in(key, i)
    kd, kl, ko = jax.random.split(k, 3)
    digit = jax.random.randint(kd, (batch_size,), 0, MODULUS, jnp.int32)
    item = jnp.take_along_axis(stack, jnp.maximum(top - 1, 0)[:, None], 1)[:, 0]
    live = top > 0
    size = jnp.maximum(item, 0)
    left = jax.random.randint(kl, (batch_size,), 1, jnp.maximum(size - 3, 2), jnp.int32)
    right = size - left - 3
    op = jnp.asarray([PLUS, MINUS, TIMES], jnp.int32)[
        jax.random.randint(ko, (batch_size,), 0, 3 if mult else 2)]
    is_literal = item < 0
    # What this step writes, and the items replacing the top (top first last).
    write = jnp.select([is_literal, size == 1, size == 2], [-1 - item, digit, MINUS], OPEN)
    pushes = jnp.stack([
        jnp.select([size == 2, size == 3, size == 4], [literal(digit), literal(CLOSE),
                                                       literal(CLOSE)], literal(CLOSE)),
        jnp.select([size == 3, size == 4], [literal(digit), literal(digit)], right),
        jnp.select([size == 4], [literal(MINUS)], literal(op)),
        left], axis=1)  # [B, 4]
    count = jnp.select([is_literal | (size == 1), size == 2, size == 3, size == 4], [0, 1, 2, 3],
                       4)
    slots = jnp.arange(depth)[None]
    base = top[:, None] - 1
    new = stack
    for j in range(4):
      new = jnp.where((slots == base + j) & (j < count[:, None]), pushes[:, j:j + 1], new)
    stack = jnp.where(live[:, None], new, stack)
    out = out.at[:, i].set(jnp.where(live, write, 0))
    top = jnp.where(live, top - 1 + count, top)
    return stack, top, out

  stack = jnp.zeros((batch_size, depth), jnp.int32).at[:, 0].set(n)
  state = (stack, jnp.ones((batch_size,), jnp.int32), jnp.zeros((batch_size, max_length),
                                                                 jnp.int32))
  _, _, out = jax.lax.fori_loop(0, max_length, step, state)
  return out


def evaluate_grammar(tokens, n):
  """Values mod 5 `[B]` of grammar strings (abstract tokens `[B, L]`, n real):
  every binary operation is bracketed, a unary minus negates the next digit."""
  b, length = tokens.shape
  depth = length + 2

  def step(state, i):
    values, vtop, ops, otop, negate, previous = state
    t = tokens[:, i]
    live = i < n
    after_value = (previous < MODULUS) | (previous == CLOSE)
    unary = (t == MINUS) & ~after_value
    binary = ((t == PLUS) | (t == TIMES) | (t == MINUS)) & after_value
    digit = t < MODULUS
    slots = jnp.arange(depth)[None]
    # ')' closing `(L op R)`: pop R, op, L; push the result.
    top_op = jnp.take_along_axis(ops, jnp.maximum(otop - 1, 0)[:, None], 1)[:, 0]
    closes_op = (t == CLOSE) & (top_op != OPEN)
    right = jnp.take_along_axis(values, jnp.maximum(vtop - 1, 0)[:, None], 1)[:, 0]
    left = jnp.take_along_axis(values, jnp.maximum(vtop - 2, 0)[:, None], 1)[:, 0]
    combined = jnp.select([top_op == PLUS, top_op == MINUS], [left + right, left - right],
                          left * right) % MODULUS
    value = jnp.where(negate, -t, t) % MODULUS
    push_value = live & digit
    values = jnp.where(push_value[:, None] & (slots == vtop[:, None]), value[:, None], values)
    vtop = jnp.where(push_value, vtop + 1, vtop)
    reduce = live & closes_op
    values = jnp.where(reduce[:, None] & (slots == vtop[:, None] - 2), combined[:, None], values)
    vtop = jnp.where(reduce, vtop - 1, vtop)
    push_op = live & ((t == OPEN) | binary)
    ops = jnp.where(push_op[:, None] & (slots == otop[:, None]), t[:, None], ops)
    otop = jnp.where(push_op, otop + 1, otop)
    otop = jnp.where(live & (t == CLOSE), otop - jnp.where(closes_op, 2, 1), otop)
    negate = jnp.where(live, unary, negate)
    previous = jnp.where(live, t, previous)
    return (values, vtop, ops, otop, negate, previous), None

  zeros = jnp.zeros((b, depth), jnp.int32)
  start = (zeros, jnp.zeros((b,), jnp.int32), zeros, jnp.zeros((b,), jnp.int32),
           jnp.zeros((b,), bool), jnp.full((b,), OPEN, jnp.int32))
  (values, vtop, *_), _ = jax.lax.scan(step, start, jnp.arange(length))
  return jnp.take_along_axis(values, jnp.maximum(vtop - 1, 0)[:, None], 1)[:, 0]


def _ids(tokens, table):
  out = tokens
  for abstract, concrete in table.items():
    out = jnp.where(tokens == abstract, concrete, out)
  return out


def generate_brackets(key, n, batch_size, max_length):
  tokens = sample_grammar(key, n, batch_size, max_length, mult=True)
  value = evaluate_grammar(tokens, n)
  real = jnp.arange(max_length)[None] < n
  return jnp.where(real, _ids(tokens, BRACKETS_IDS), 0), value[:, None].astype(jnp.int32)


def generate_equation(key, n, batch_size, max_length):
  """Their `generate_equation_and_solution` (module docstring); n < 3: zeros."""
  grammar_key, index_key = jax.random.split(key)
  m = jnp.maximum(n - 2, 1)
  tokens = sample_grammar(grammar_key, m, batch_size, max_length, mult=False)
  value = evaluate_grammar(tokens, m)
  p = jnp.arange(max_length)[None]
  start = jax.random.randint(index_key, (batch_size, 1), 0, m, jnp.int32)
  is_digit = (tokens < MODULUS) & (p < m)
  ahead = is_digit & (p >= start)
  hidden = jnp.where(jnp.any(ahead, axis=1), jnp.argmax(ahead, axis=1),
                     jnp.argmax(is_digit, axis=1))[:, None]
  solution = jnp.take_along_axis(tokens, hidden, 1)
  x = jnp.where(p == hidden, UNKNOWN, _ids(tokens, EQUATION_IDS))
  x = jnp.where(p < m, x, jnp.where(p == m, EQUALS, jnp.where(p == m + 1, value[:, None], 0)))
  small = n < 3
  return (jnp.where(small | (p >= n), 0, x).astype(jnp.int32),
          jnp.where(small, 0, solution).astype(jnp.int32))


def _generate_arithmetic(key, n, batch_size, max_length):
  x = sample_modular_arithmetic(key, n, batch_size, max_length)
  return x, label_modular_arithmetic(x, n)


TASKS = {
    'modular_arithmetic': TaskSpec('modular_arithmetic', 'regular', 9, MODULUS,
                                   _generate_arithmetic,
                                   input_length=modular_arithmetic_length),
    'modular_arithmetic_brackets': TaskSpec('modular_arithmetic_brackets', 'context_free',
                                            MODULUS + 6, MODULUS, generate_brackets),
    'solve_equation': TaskSpec('solve_equation', 'context_free', MODULUS + 6, MODULUS,
                               generate_equation),
}
