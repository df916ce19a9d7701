"""Parameters annotated with logical axis names, the rule sets, and a sharded
model on 4 emulated CPU devices equal to the unsharded one.

The multi-device test runs in a subprocess: XLA reads
`--xla_force_host_platform_device_count` once, when JAX starts, so the
pytest process (one CPU device) cannot grow a mesh."""

import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import pytest
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import attention_jax as aj
from attention_jax.nn import sharding

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MESHES = {'fsdp': ((4,), ('fsdp',), sharding.FSDP_RULES),
          'tensor_parallel': ((2, 2), ('data', 'model'), sharding.TENSOR_PARALLEL_RULES)}


def _lm(encoding='fire', **options):
  return aj.TransformerLM(vocab_size=16, d_model=16, num_heads=4, num_kv_heads=2,
                          num_layers=2, mlp_dim=32, encoding=encoding, max_positions=16,
                          rngs=nnx.Rngs(0), **options)


def _params(module):
  return [(path, v) for path, v in nnx.to_flat_state(nnx.state(module, nnx.Param))]


def _wanted_spec(variable, rules) -> P:
  """What the rules ask for this parameter: each logical name's mesh axis."""
  rules = dict(rules)
  return P(*(rules[name] if name is not None else None
             for name in variable.get_metadata()['out_sharding']))


class AnnotationTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters((name, name) for name in sorted(aj.ENCODINGS))
  def test_every_parameter_names_each_axis(self, encoding):
    model = _lm(encoding, scalable_softmax=1.0)
    for path, variable in _params(model):
      axes = variable.get_metadata().get('out_sharding')
      self.assertIsNotNone(axes, path)
      self.assertLen(axes, variable[...].ndim, path)
      self.assertTrue(set(axes) <= set(sharding.LOGICAL_AXES) | {None}, (path, axes))
      spec = _wanted_spec(variable, sharding.TENSOR_PARALLEL_RULES)
      named = [a for a in spec if a is not None]
      self.assertEqual(len(named), len(set(named)), (path, spec))  # a mesh axis once

  def test_other_modules_name_every_axis(self):
    modules = [
        aj.SelfAttention(16, 8, encoding='t5', rngs=nnx.Rngs(0)),
        aj.AdditiveAttention(8, 8, 8, rngs=nnx.Rngs(0)),
        aj.MultiHeadAttention(16, 4, causal=True, use_bias=True,
                              normalization=aj.StickBreaking(remainder='head_bias'),
                              rngs=nnx.Rngs(0)),
        aj.TransformerEncoder(vocab_size=5, output_size=2, d_model=16, num_heads=4,
                              num_layers=1, mlp_dim=32, encoding='relative', rngs=nnx.Rngs(0)),
        aj.Seq2Seq(vocab_size=5, embed_dim=8, hidden_dim=8, attention=True, start_token=1,
                   bidirectional=True, rngs=nnx.Rngs(0)),
    ]
    for module in modules:
      for path, variable in _params(module):
        axes = variable.get_metadata().get('out_sharding')
        self.assertIsNotNone(axes, (type(module).__name__, path))
        self.assertLen(axes, variable[...].ndim, path)

  def test_weights_from_flax_keep_the_axis_names(self):
    ours = aj.MultiHeadAttention(16, 4, causal=False, use_bias=True, rngs=nnx.Rngs(0))
    before = {path: v.get_metadata()['out_sharding'] for path, v in _params(ours)}
    flax_mha = nnx.MultiHeadAttention(4, 16, decode=False, rngs=nnx.Rngs(1))
    nnx.update(ours, aj.nn.from_flax(nnx.state(flax_mha, nnx.Param), ours))
    chex.assert_trees_all_equal(ours.W_Q.kernel[...], flax_mha.query.kernel[...])
    self.assertEqual({path: v.get_metadata()['out_sharding'] for path, v in _params(ours)},
                     before)

  def test_the_rules_give_the_documented_specs(self):
    model = _lm()
    want = {
        'fsdp': {('embed', 'embedding'): P(None, 'fsdp'),
                 ('blocks', 0, 'attention', 'W_Q', 'kernel'): P('fsdp', None, None),
                 ('blocks', 0, 'mlp_out', 'kernel'): P(None, 'fsdp'),
                 ('unembed', 'kernel'): P('fsdp', None)},
        'tensor_parallel': {('embed', 'embedding'): P('model', None),
                            ('blocks', 0, 'attention', 'W_Q', 'kernel'): P(None, 'model', None),
                            ('blocks', 0, 'attention', 'W_K', 'kernel'): P(None, 'model', None),
                            ('blocks', 0, 'attention', 'W_O', 'kernel'): P('model', None, None),
                            ('blocks', 0, 'mlp_in', 'kernel'): P(None, 'model'),
                            ('blocks', 0, 'mlp_out', 'kernel'): P('model', None),
                            ('unembed', 'kernel'): P(None, 'model'),
                            ('blocks', 0, 'attention', 'positional', 'w2'): P(None, 'model')},
    }
    for layout, specs in want.items():
      with nnx.logical_axis_rules(MESHES[layout][2]):
        flat = dict(nnx.to_flat_state(nnx.get_partition_spec(nnx.state(model, nnx.Param))))
      for path, spec in specs.items():
        self.assertEqual(flat[path].get_value(), spec, (layout, path))

  def test_logical_rules_refuse_unknown_names(self):
    with self.assertRaisesRegex(ValueError, r"logical_rules: unknown logical axis names "
                                r"\['embedding'\]; the library's are \['embed', 'heads'"):
      sharding.logical_rules(embedding='fsdp')
    self.assertEqual(dict(sharding.logical_rules(mlp='model'))['embed'], None)

  def test_constrain_without_a_mesh_returns_its_input(self):
    x = jnp.ones((2, 3, 4))
    with nnx.logical_axis_rules(sharding.FSDP_RULES):
      self.assertIs(sharding.constrain(x, sharding.BATCH_LENGTH_EMBED), x)
    self.assertIs(sharding.constrain(x, sharding.BATCH_LENGTH_EMBED), x)

  @pytest.mark.slow  # a process of 4 devices, ~30 s cold; the rules are checked above
  def test_sharded_model_equals_the_unsharded_on_four_devices(self):
    env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=4',
               JAX_PLATFORMS='cpu')
    code = 'from tests.nn.test_sharding import check_on_four_devices; check_on_four_devices()'
    proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
    self.assertIn('checked fsdp and tensor_parallel', proc.stdout)


def _loss(model, tokens):
  logits = model(tokens[:, :-1])
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))


@nnx.jit
def _step(model, tokens):
  """Loss, gradients and the parameters after one SGD step (rate 0.1)."""
  loss, grads = nnx.value_and_grad(_loss)(model, tokens)
  params = nnx.state(model, nnx.Param)
  return loss, grads, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def check_on_four_devices():
  """The subprocess's body: for each layout, a model initialised sharded (the
  docs/api.md recipe) gives the unsharded model's logits, loss, gradients and
  SGD step, and each parameter is sharded as the rules ask."""
  assert jax.device_count() == 4, jax.devices()
  tokens = jax.random.randint(jax.random.key(1), (4, 9), 0, 16)
  reference = _lm()
  want_logits = reference(tokens)
  want = _step(reference, tokens)
  for layout, (shape, names, rules) in MESHES.items():
    mesh = jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):

      @nnx.jit
      def sharded_init():
        model = _lm()
        state = nnx.state(model)
        nnx.update(model, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
        return model

      model = sharded_init()
      for path, variable in _params(model):
        got = variable[...].sharding
        wanted = NamedSharding(mesh, _wanted_spec(variable, rules))
        assert got.is_equivalent_to(wanted, variable[...].ndim), (layout, path, got, wanted)
      chex.assert_trees_all_close(nnx.jit(lambda m, t: m(t))(model, tokens), want_logits,
                                  atol=1e-5)
      got = _step(model, tokens)
      chex.assert_trees_all_close(got, want, atol=1e-5)
    # Sharded for real: FSDP splits the embedding's width, TP the MLP units.
    kernel = model.blocks[0].mlp_in.kernel[...]
    assert len(kernel.sharding.device_set) == 4
    assert kernel.addressable_shards[0].data.shape == ((4, 32) if layout == 'fsdp'
                                                       else (16, 16)), layout
  print('checked fsdp and tensor_parallel')


if __name__ == '__main__':
  absltest.main()
