"""Binary arithmetic: binary_addition, binary_multiplication, compute_sqrt
(context-sensitive), following google-deepmind/randomized_positional_encodings
`tasks/cs/{binary_addition,binary_multiplication,compute_sqrt}.py`.

Their sampling, length n:
* addition and multiplication, n <= 2: no operator; the input is
  `np.random.randint(0, 2**n - 1)` (high exclusive: 0 at n = 1, 0 … 2 at
  n = 2) in n little-endian bits. Addition outputs that number's bits without
  leading zeros ('0' for 0), multiplication `[0] * (n - 1)`.
* n > 2: operand lengths `np.random.randint(1, n - 1)` (1 … n - 2) and
  n - 1 minus it, each operand `random.randint(1, 2**len - 1)` (inclusive)
  in exactly len little-endian bits, joined by the operator 2. The output is
  the result's little-endian bits without leading zeros, the terminator 2,
  then zeros: n + 1 symbols for addition, n for multiplication.
* compute_sqrt: `random.randint(1, 2**n - 1)` in n big-endian bits; the
  output `math.isqrt` in ceil(n / 2) big-endian bits.

Numbers reach 2^500, so they are bit vectors here (little-endian, `[B, W]`
int32 of 0/1): addition by a carry-lookahead `associative_scan`,
multiplication by shift-and-add, the square root by the restoring
digit-by-digit method. A uniform integer in [1, 2^L - 1] is L uniform bits
redrawn while all zero (`lax.while_loop`): exactly their distribution (each
row keeps its first non-zero draw of an i.i.d. sequence of uniform draws).

Their docstrings and code disagree; this follows the code:
* the docstrings say the output is padded to the input length; addition's is
  n + 1 symbols (`output_length`), so their addition examples are one short;
* the multiplication example `18 * 6 = 108 = 00110011` should read 0011011,
  the square-root example `37 -> 101` should read 110 (6);
* at n <= 2 the multiplication output `[0] * (n - 1) + [2]` is not the
  input's product (the input is a bare number, no operator).
"""

import jax
import jax.numpy as jnp

from attention_jax.lab.tasks.spec import TaskSpec

OPERATOR = 2  # '+' / '*' in the input
TERMINATOR = 2  # end of the result in the output


def add_bits(a, b):
  """Little-endian bit vectors `[B, W]` -> their sum `[B, W]` (mod 2^W)."""
  generate, propagate = a & b, a ^ b

  def combine(low, high):  # carry into the next bit over a run of bits
    g1, p1 = low
    g2, p2 = high
    return g2 | (p2 & g1), p2 & p1

  carry, _ = jax.lax.associative_scan(combine, (generate, propagate), axis=1)
  carry_in = jnp.pad(carry, ((0, 0), (1, 0)))[:, :-1]
  return propagate ^ carry_in


def multiply_bits(a, b):
  """Little-endian `[B, W]` × `[B, W]` -> the product `[B, W]` (mod 2^W)."""
  width = a.shape[1]

  def step(total, i):
    shifted = jnp.where(jnp.arange(width)[None] >= i,
                        jnp.roll(a, i, axis=1), 0)
    bit = jax.lax.dynamic_slice_in_dim(b, i, 1, axis=1)
    return jnp.where(bit == 1, add_bits(total, shifted), total), None

  total, _ = jax.lax.scan(step, jnp.zeros_like(a), jnp.arange(width))
  return total


def _greater_equal(r, t):
  """r >= t for little-endian bit vectors (the carry out of r + ~t + 1)."""
  width = r.shape[1]
  not_t = 1 - t
  one = jnp.zeros_like(t).at[:, 0].set(1)
  wide = lambda v: jnp.pad(v, ((0, 0), (0, 1)))
  difference = add_bits(add_bits(wide(r), wide(not_t).at[:, width].set(1)), wide(one))
  return difference[:, width] == 0, difference[:, :width]


def isqrt_bits(x, num_pairs: int):
  """floor(sqrt(x)) of little-endian `[B, 2·num_pairs]` bits -> `[B, num_pairs]`."""
  b = x.shape[0]
  width = num_pairs + 3

  def step(carry, i):
    remainder, root = carry
    hi, lo = x[:, 2 * i + 1], x[:, 2 * i]  # the next pair, from the top
    remainder = jnp.concatenate([lo[:, None], hi[:, None], remainder[:, :-2]], axis=1)
    trial = jnp.concatenate([jnp.ones((b, 1), jnp.int32), jnp.zeros((b, 1), jnp.int32),
                             root[:, :-2]], axis=1)  # 4·root + 1
    fits, difference = _greater_equal(remainder, trial)
    remainder = jnp.where(fits[:, None], difference, remainder)
    root = jnp.concatenate([fits[:, None].astype(jnp.int32), root[:, :-1]], axis=1)
    return (remainder, root), None

  start = (jnp.zeros((b, width), jnp.int32), jnp.zeros((b, width), jnp.int32))
  (_, root), _ = jax.lax.scan(step, start, jnp.arange(num_pairs)[::-1])
  return root[:, :num_pairs]


def _bit_length(bits):
  """Bits up to the highest set one, at least 1 (`f'{num:b}'` of 0 is '0')."""
  width = bits.shape[1]
  highest = width - 1 - jnp.argmax(bits[:, ::-1], axis=1)
  return jnp.where(jnp.any(bits == 1, axis=1), highest + 1, 1)[:, None]


def _operands(x, n):
  """(a, b, has_operator) little-endian `[B, N]` each from `a OP b`."""
  big = x.shape[1]
  p = jnp.arange(big)[None, :]
  real = p < n
  is_op = (x == OPERATOR) & real
  at = jnp.where(jnp.any(is_op, axis=1), jnp.argmax(is_op, axis=1), n)[:, None]
  a = jnp.where(p < at, x, 0)
  b_index = jnp.clip(p + at + 1, 0, big - 1)
  b = jnp.where(p + at + 1 < n, jnp.take_along_axis(x, b_index, axis=1), 0)
  return a, b, jnp.any(is_op, axis=1)


def _result_tokens(bits, output_width):
  """Bits without leading zeros, the terminator, zeros: `[B, output_width]`."""
  length = _bit_length(bits)
  j = jnp.arange(output_width)[None, :]
  padded = jnp.pad(bits, ((0, 0), (0, max(0, output_width - bits.shape[1]))))[:, :output_width]
  return jnp.where(j < length, padded, jnp.where(j == length, TERMINATOR, 0)).astype(jnp.int32)


def label_addition(x, n):
  """`[B, N + 1]`: the sum's bits (n <= 2: the input number's), the terminator."""
  a, b, _ = _operands(x, n)
  width = x.shape[1] + 1
  wide = lambda v: jnp.pad(v, ((0, 0), (0, 1)))
  total = jnp.where(n <= 2, wide(a), add_bits(wide(a), wide(b)))
  return _result_tokens(total, width)


def label_multiplication(x, n):
  """`[B, N]`: the product's bits then the terminator (n <= 2: n - 1 zeros, 2)."""
  a, b, _ = _operands(x, n)
  width = x.shape[1]
  tokens = _result_tokens(multiply_bits(a, b), width)
  j = jnp.arange(width)[None, :]
  small = jnp.where(j == n - 1, TERMINATOR, 0)
  return jnp.where(n <= 2, small, tokens).astype(jnp.int32)


def nonzero_bits(key, lengths, width: int):
  """Uniform integers in [1, 2^lengths - 1] as `[B, width]` little-endian bits
  (`lengths` int `[B, 1]`, >= 1): uniform bits, rows redrawn while all zero."""
  keep = jnp.arange(width)[None, :] < lengths

  def draw(k):
    return jnp.where(keep, jax.random.bernoulli(k, 0.5, keep.shape).astype(jnp.int32), 0)

  def redraw(state):
    bits, i = state
    fresh = draw(jax.random.fold_in(key, i))
    zero = ~jnp.any(bits == 1, axis=1, keepdims=True)
    return jnp.where(zero, fresh, bits), i + 1

  bits, _ = jax.lax.while_loop(lambda s: ~jnp.all(jnp.any(s[0] == 1, axis=1)), redraw,
                               (draw(jax.random.fold_in(key, 0)), 1))
  return bits


def sample_operands(key, n, batch_size, max_length):
  """`a OP b` as their sampler draws it (module docstring): `[B, N]`."""
  k_len, k_a, k_b, k_small = jax.random.split(key, 4)
  p = jnp.arange(max_length)[None, :]
  len_a = jax.random.randint(k_len, (batch_size, 1), 1, jnp.maximum(n - 1, 2), jnp.int32)
  len_b = n - 1 - len_a
  a = nonzero_bits(k_a, len_a, max_length)
  b = nonzero_bits(k_b, jnp.maximum(len_b, 1), max_length)
  b_at = jnp.take_along_axis(b, jnp.clip(p - len_a - 1, 0, max_length - 1), axis=1)
  x = jnp.where(p < len_a, a, jnp.where(p == len_a, OPERATOR, b_at))
  x = jnp.where(p < n, x, 0)
  # np.random.randint(0, 2**n - 1) excludes its high end: 0 at n = 1, 0 … 2 at n = 2.
  small = jax.random.randint(k_small, (batch_size, 1), 0,
                             jnp.left_shift(1, jnp.minimum(n, 2)) - 1, jnp.int32)
  small_bits = jnp.where(p < n, jnp.right_shift(small, jnp.minimum(p, 30)) & 1, 0)
  return jnp.where(n <= 2, small_bits, x).astype(jnp.int32)


def sample_sqrt(key, n, batch_size, max_length):
  """An integer uniform in [1, 2^n - 1], n big-endian bits: `[B, N]`."""
  little = nonzero_bits(key, jnp.full((batch_size, 1), n), max_length)
  p = jnp.arange(max_length)[None, :]
  big = jnp.take_along_axis(little, jnp.broadcast_to(jnp.clip(n - 1 - p, 0, max_length - 1),
                                                     little.shape), axis=1)
  return jnp.where(p < n, big, 0).astype(jnp.int32)


def label_sqrt(x, n):
  """`[B, ceil(N / 2)]`: isqrt of the big-endian input, big-endian, in ceil(n / 2) bits."""
  big = x.shape[1]
  pairs = (big + 1) // 2
  p = jnp.arange(2 * pairs)[None, :]
  little = jnp.where(p < n, jnp.take_along_axis(
      x, jnp.broadcast_to(jnp.clip(n - 1 - p, 0, big - 1), (x.shape[0], 2 * pairs)), axis=1), 0)
  root = isqrt_bits(little, pairs)
  k = (n + 1) // 2
  j = jnp.arange(pairs)[None, :]
  out = jnp.take_along_axis(root, jnp.broadcast_to(jnp.clip(k - 1 - j, 0, pairs - 1),
                                                   root.shape), axis=1)
  return jnp.where(j < k, out, 0).astype(jnp.int32)


def _task(name, label, sample, output_length, terminated, input_size=3, output_size=3):
  def generate(key, n, batch_size, max_length):
    x = sample(key, n, batch_size, max_length)
    return x, label(x, n)
  return TaskSpec(name, 'context_sensitive', input_size, output_size, generate,
                  output_length=output_length, terminated=terminated)


TASKS = {
    'binary_addition': _task('binary_addition', label_addition, sample_operands,
                             lambda n: n + 1, True),
    'binary_multiplication': _task('binary_multiplication', label_multiplication,
                                   sample_operands, lambda n: n, True),
    'compute_sqrt': _task('compute_sqrt', label_sqrt, sample_sqrt, lambda n: (n + 1) // 2,
                          False, input_size=2, output_size=2),
}
