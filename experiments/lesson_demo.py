"""Lesson 7 in numbers: the worked example and the lesson's shapes, recomputed.

  python -m experiments.lesson_demo

Prints lesson 7.2's steps 4–5 from its score matrix S (the true softmax; the
lesson's printed weights are not one, see README) and the output shapes of
lessons 7.2–7.4. Mostly the build of one module per encoding at width 512
(README: its measured time).
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from flax import nnx

import attention_jax as aj
from attention_jax.lab.config.command_line import parse_flags


def main(argv):
  del argv
  np.set_printoptions(precision=4, suppress=True)
  s = jnp.array([[2.1, 1.4, 0.8], [0.9, 3.2, 1.1], [1.3, 1.7, 2.9]])
  # q = S and k = I give q kᵀ = S; v = I makes the output equal the weights.
  out, weights = aj.dot_product_attention(s, jnp.eye(3), jnp.eye(3))
  print('Lesson 7.2, step 4: S / sqrt(3) =\n', np.asarray(s / jnp.sqrt(3.0)))
  print('Lesson 7.2, step 5: softmax rows =\n', np.asarray(weights))
  print('  row sums:', np.asarray(weights.sum(-1)))
  print('Lesson 7.2, step 6: output with V = I equals the weights:',
        bool(jnp.allclose(out, weights)))

  rngs = nnx.Rngs(0)
  x = jax.random.normal(jax.random.key(0), (4, 10, 64))
  out, weights = aj.SelfAttention(d_model=64, d_k=32, rngs=rngs)(x, return_weights=True)
  print('SelfAttention(64, 32): out', out.shape, 'weights', weights.shape)
  x = jax.random.normal(jax.random.key(1), (2, 16, 512))
  for encoding in sorted(aj.ENCODINGS):
    pe = aj.make_encoding(encoding, d_model=512, num_heads=8, max_positions=16, rngs=rngs)
    # Absolute encodings are added to the embeddings; the rest act inside attention.
    h = pe.add_to_embeddings(x, np.arange(16))
    inside = pe.acts_in_attention
    mha = aj.MultiHeadAttention(512, 8, causal=True, encoding=pe if inside else None, rngs=rngs)
    out, weights = mha(h, return_weights=True)  # causal: query i sees keys j <= i
    label = (f'MultiHeadAttention(512, 8, encoding={encoding!r})' if inside else
             'MultiHeadAttention(512, 8), no encoding' if isinstance(pe, aj.positional.NoPE)
             else f'MultiHeadAttention(512, 8) on x + {encoding} embeddings')
    print(f'{label}: out', out.shape, 'weights', weights.shape)
  print('sinusoidal(20, 128):', aj.positional.sinusoidal(20, 128).shape)
  print('alibi_slopes(12):', aj.positional.alibi_slopes(12))


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)  # its one-line errors, and no libtpu line
