"""PaTH's programs lower for TPU and CUDA from this CPU: `jax.export` of a
small layer's training step (forward and backward, on the dense kernel and
on 'path_blockwise') and of cached decoding, with the dispatcher told it
runs there. Nothing executes: the arguments are `jax.ShapeDtypeStruct`s."""

import re
from unittest import mock

import jax
import jax.numpy as jnp
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.attention import dispatch

BACKENDS = {'tpu': 'tpu', 'cuda': 'gpu'}  # what jax.default_backend() says there
CALLBACK_TARGET = re.compile(rb'xla_(?:ffi_)?python_\w*callback')
D_MODEL, HEADS = 32, 4


def _layer(encoding):
  return aj.MultiHeadAttention(D_MODEL, HEADS, causal=True, num_kv_heads=2, encoding=encoding,
                               encoding_options={'num_kv_heads': 2}, rngs=nnx.Rngs(0))


class PathLoweringTest(parameterized.TestCase):

  def _export(self, fn, args, platform):
    picked = []
    select = dispatch.select_implementation
    spy = lambda *a, **k: picked.append(select(*a, **k)) or picked[-1]
    with mock.patch.object(dispatch, 'current_backend', return_value=BACKENDS[platform]), \
        mock.patch.object(dispatch, 'select_implementation', spy):
      exported = jax.export.export(jax.jit(fn), platforms=(platform,))(*args)
    self.assertNotRegex(exported.mlir_module_serialized, CALLBACK_TARGET)
    return picked

  @parameterized.product(platform=('tpu', 'cuda'), encoding=('path', 'path_fox'),
                         length=(16, 256))
  def test_path_train_step_lowers(self, platform, encoding, length):
    graphdef, state = nnx.split(_layer(encoding))

    def step(state, x):
      loss = lambda s: jnp.mean(nnx.merge(graphdef, s)(x) ** 2)
      return jax.value_and_grad(loss)(state)

    x = jax.ShapeDtypeStruct((2, length, D_MODEL), jnp.bfloat16)
    state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
    picked = self._export(step, (state, x), platform)
    # 'auto' runs PaTH blockwise from its threshold, dense below it.
    self.assertEqual(set(picked), {'path_blockwise' if length >= 256 else 'dense'})

  @parameterized.product(platform=('tpu', 'cuda'), encoding=('path', 'path_fox'))
  def test_path_cached_decoding_lowers(self, platform, encoding):
    model = aj.TransformerLM(vocab_size=11, d_model=D_MODEL, num_heads=HEADS, num_layers=1,
                             mlp_dim=32, encoding=encoding, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    cache = jax.eval_shape(lambda: model.init_cache(2, 64))

    def decode(state, token, cache, start):
      return nnx.merge(graphdef, state).extend(token, cache, start)

    args = (jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state),
            jax.ShapeDtypeStruct((2, 1), jnp.int32), cache,
            jax.ShapeDtypeStruct((), jnp.int32))
    self.assertTrue(self._export(decode, args, platform))


if __name__ == '__main__':
  absltest.main()
