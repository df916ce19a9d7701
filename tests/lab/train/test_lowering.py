"""Every program the lab compiles lowers for TPU and for CUDA, from this CPU.

`jax.export.export(program, platforms=(platform,))` lowers without the
accelerator and refuses what the program could not be shipped with there: a
host callback (the CPU client cannot lower one for another platform, and
export refuses host callbacks anyway), an op with no lowering rule for the
platform, a custom call with no stability guarantee. Nothing executes: the
arguments are `jax.ShapeDtypeStruct`s of the smallest models.

The attention dispatcher picks its kernel from the backend at trace time, so
each platform is traced with the dispatcher told it runs there
(`_on_platform`), and a program whose kernels differ between the platforms
(a Pallas kernel for TPU, another for CUDA) is exported for each alone; one
whose kernels agree is exported for both at once, which costs about one
export (`_export`).

Programs: the train step (`train/step.py`) of every encoding, plain, with
seeds stacked (`jax.vmap`), data parallel on a mesh, and FSDP and tensor
parallel (`train.mesh`); the per-length
evaluation (`evaluate/lengths.py`), teacher-forced and by cached generation,
also with the seeds stacked, at lengths where 'auto' runs blockwise, and with
RoPE context extension; `generate` (`nn/transformer.py`); the diagnostics'
attention weights; the seq2seq models; the flip-flop paper preset (a
6-layer model of width 512 at 2,048 tokens), which no CPU run trains.
"""

import contextlib
import io
import re
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from attention_jax.attention import dispatch
from attention_jax.lab.config import facts
from attention_jax.lab import tasks
from attention_jax.lab.config import validate
from attention_jax.lab.evaluate import rope_scaled
from attention_jax.lab.evaluate.lengths import evaluation_program
from attention_jax.lab.train import mesh as train_mesh
from attention_jax.lab.train.loop import data_mesh
from attention_jax.lab.train.optimizer import make_optimizer
from attention_jax.lab.train.step import step_function
from attention_jax.nn.decoding import generate
from attention_jax.positional import registry
from attention_jax.positional.rope import RopeScaling
from attention_jax.lab.config.resolved import resolve
from configs import copy as copy_config
from configs import flipflop as flipflop_config
from configs import seq2seq as seq2seq_config
from tests import tiers

PLATFORMS = ('tpu', 'cuda')
BACKENDS = {'tpu': 'tpu', 'cuda': 'gpu'}  # what jax.default_backend() says there
# Every registry encoding, then the study's modified ones (randomized,
# coupled, stick-breaking): 'SPEC:stick_breaking' sets model.normalization.
# Programs whose encoding-specific part is the train step's or the
# evaluation's (stacked seeds, cached `generate`, weights) take a few:
# traced positions, data-dependent biases, stick-breaking.
SOME_ENCODINGS = ('learned', 'windowed_rope:coupled', 'rope:randomized', 'fox',
                  'none:stick_breaking')
# SOME_ENCODINGS first: the cases `make test` keeps (`tiers.fast_cases`).
ENCODINGS = tuple(dict.fromkeys(SOME_ENCODINGS + tuple(registry.ENCODINGS) + tuple(
    e for e in copy_config.ALL if e not in registry.ENCODINGS) + ('alibi:stick_breaking',)))
STACKED_ENCODINGS = ('windowed_rope:coupled',)  # coupled positions, drawn per seed
# Encodings the blockwise kernels serve (no bias, a linear one, stick-breaking):
# a long sequence must not run 'dense'.
BLOCKWISE_ENCODINGS = ('rope', 'alibi', 'none:stick_breaking')
BATCH, SEEDS, STEPS_PER_CALL, PROMPT, NEW_TOKENS = 2, 2, 2, 3, 4
KEY = jax.eval_shape(jax.random.key, 0)  # a typed PRNG key, shape ()
# Kernels on Pallas' Triton backend: their custom call is stable for no JAX version.
TRITON_KERNELS = frozenset(n for n, k in dispatch.KERNELS.items()
                           if k.run.__module__.endswith('pallas_gpu'))
TRITON_CHECK = jax.export.DisabledSafetyCheck.custom_call('__gpu$xla.gpu.triton')

# The custom-call targets of JAX's host callbacks (xla_ffi_python_cpu_callback, …);
# a plain 'callback' would match locations, which name Python functions.
CALLBACK_TARGET = re.compile(rb'xla_(?:ffi_)?python_\w*callback')


def _name(*parts) -> str:
  return '_'.join(re.sub(r'[^0-9a-zA-Z]+', '_', str(p)) for p in parts)


def _cases(encodings=ENCODINGS):
  """Each entry on both platforms, side by side (so one export can serve
  both: `_export`), in the order given: `tiers.fast_cases` keeps the first."""
  return [dict(testcase_name=_name(p, e), platform=p, entry=e)
          for e in encodings for p in PLATFORMS]


@contextlib.contextmanager
def _on_platform(platform: str):
  """The dispatcher picks kernels as on `platform`."""
  with mock.patch.object(dispatch, 'current_backend', return_value=BACKENDS[platform]):
    yield


def _picks(requests, platform: str):
  """The kernels `select_implementation` picks for `requests` on `platform`
  (None if one is refused there)."""
  with _on_platform(platform):
    try:
      return [dispatch.select_implementation(*a, **k) for a, k in requests]
    except ValueError:
      return None


# Test key -> (exported, kernels picked) of a program exported for both
# platforms at once, for the other platform's test; None: export it alone.
_SHARED = {}


def _export(key, build, args, platform: str, share: bool = True):
  """The jitted program `build()` makes, exported for `platform`, and the
  kernels its attention runs on there.

  The program is traced with the dispatcher on `platform`. The dispatcher is
  the only backend-dependent step of a trace, so when each of its kernel
  requests picks the same kernel on the other platform the trace is the
  other platform's program too, and one export lowers it for both (about
  the cost of one), kept for the other platform's test under the same key.
  If that export fails (or not `share`), each platform exports alone, so the
  error names its platform. Triton's custom call is allowed only where a
  Triton kernel runs.
  """
  shared = _SHARED.pop(key, False)  # False: not tried; None: failed for both
  if shared:
    return shared
  program, requests, select = build(), [], dispatch.select_implementation
  spy = lambda *a, **k: requests.append((a, k)) or select(*a, **k)
  with _on_platform(platform), mock.patch.object(dispatch, 'select_implementation', spy):
    program.trace(*args)
  picks = _picks(requests, platform)
  if share and shared is False and all(_picks(requests, p) == picks for p in PLATFORMS):
    try:
      with _on_platform(platform):
        _SHARED[key] = jax.export.export(program, platforms=PLATFORMS)(*args), picks
      return _SHARED[key]
    except Exception:  # pylint: disable=broad-except
      _SHARED[key] = None  # the single export below says what fails
  checks = [TRITON_CHECK] if platform == 'cuda' and TRITON_KERNELS & set(picks) else []
  with _on_platform(platform):
    exported = jax.export.export(program, platforms=(platform,), disabled_checks=checks)(*args)
  return exported, picks


def _abstract(tree, sharding=None, seeds=None):
  """ShapeDtypeStructs of `tree`'s leaves, with a leading seed axis if `seeds`."""
  lead = () if seeds is None else (seeds,)
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(lead + x.shape, x.dtype, sharding=sharding), tree)


def _int(shape=(), sharding=None):
  return jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding)


_PARTS = {}  # shared by every test and platform of one model


def _parts(entry='none', kind='transformer', bidirectional=False, score='additive',
           max_length=0):
  """The tiny preset of `entry` ('SPEC' or 'SPEC:stick_breaking'), batch 2,
  trained and evaluated up to `max_length` if given -> (config, model
  graphdef, abstract model state, (model, optimizer) graphdef, its abstract
  state): shapes only, no parameter is drawn."""
  key = (entry, kind, bidirectional, score, max_length)
  if key not in _PARTS:
    if kind == 'transformer':
      c = copy_config.get_config(f'scale=tiny,encoding={entry}')
    else:
      c = seq2seq_config.get_config('scale=tiny')
      c.model.update(kind=kind, bidirectional=bidirectional, attention_score=score)
    c.train.update(batch_size=BATCH, steps_per_call=STEPS_PER_CALL)
    c.eval.update(num_samples=BATCH, batch_size=BATCH)
    if max_length:
      c.task.train_max_length = c.eval.max_length = max_length
    tx = make_optimizer(c.train)

    def build():
      model = resolve(c).build_model(0)
      return model, nnx.Optimizer(model, tx, wrt=nnx.Param)

    model, optimizer = nnx.eval_shape(build)
    _PARTS[key] = (c, *nnx.split(model), *nnx.split((model, optimizer)))
  return _PARTS[key]


def _train_program(c, graphdef, *, data_sharding=None, vmap_seeds=False):
  """`train/loop.py::_train`'s step program for config `c` (a fresh one:
  `__wrapped__` bypasses the memo, whose jitted function keeps its traces)."""
  return lambda: step_function.__wrapped__(
      graphdef=graphdef, task=facts.configured_task(c), batch_size=c.train.batch_size,
      min_length=c.task.train_min_length, max_length=c.task.train_max_length,
      vocab_size=c.task.vocab_size,
      layout='decoder_only' if c.model.kind == 'transformer' else 'seq2seq',
      data_sharding=data_sharding, max_position=facts.randomized_max_position(c),
      draw=c.positions.draw, steps_per_call=c.train.steps_per_call, vmap_seeds=vmap_seeds)


def _eval_program(c, graphdef, *, generation=False, stacked=False):
  """`evaluate_models`' program for the longest bucket, with `one_run._evaluate`'s
  arguments (randomized positions when evaluated 'random')."""
  max_position = (facts.randomized_max_position(c)
                  if c.positions.randomized_eval == 'random' else 0)
  return lambda: evaluation_program.__wrapped__(
      graphdef=graphdef, task=facts.configured_task(c), bucket=c.eval.max_length,
      num_samples=c.eval.batch_size, vocab_size=c.task.vocab_size, max_position=max_position,
      draw=c.positions.draw, generate=generation, stacked=stacked)


def _custom_call_targets(module_text: str) -> set[str]:
  return set(re.findall(r'stablehlo\.custom_call @([\w$.]+)', module_text))


class LoweringTest(chex.TestCase, parameterized.TestCase):

  def _lowers(self, key, build, args, platform):
    """Exports for `platform` -> (the exported module, the kernels picked)."""
    exported, picks = _export(key, build, args, platform)
    self.assertIn(platform, exported.platforms)
    self.assertIsNone(CALLBACK_TARGET.search(exported.mlir_module_serialized),
                      'a host callback in the exported module')
    return exported, picks

  @parameterized.named_parameters(_cases())
  @tiers.fast_cases(2 * len(SOME_ENCODINGS))  # every other encoding in the slow tier
  def test_train_step_lowers_for_platform(self, platform, entry):
    c, _, _, graphdef, state = _parts(entry)
    self._lowers(('train', entry), _train_program(c, graphdef), (state, _int(), _int()),
                 platform)

  # Its attention is the train step's forward: a few encodings suffice.
  @parameterized.named_parameters(_cases(SOME_ENCODINGS + ('learned:randomized', 'cope')))
  @tiers.fast_cases(4)
  def test_evaluation_lowers_for_platform(self, platform, entry):
    c, graphdef, state, _, _ = _parts(entry)
    self._lowers(('evaluate', entry), _eval_program(c, graphdef), (state, KEY, _int()),
                 platform)

  @parameterized.named_parameters(_cases())
  @tiers.fast_cases(4)
  def test_generation_scoring_lowers_for_platform(self, platform, entry):
    c, graphdef, state, _, _ = _parts(entry)
    self._lowers(('generation', entry), _eval_program(c, graphdef, generation=True),
                 (state, KEY, _int()), platform)

  @parameterized.named_parameters(_cases(SOME_ENCODINGS))
  @tiers.fast_cases(4)
  def test_cached_generate_lowers_for_platform(self, platform, entry):
    _, graphdef, state, _, _ = _parts(entry)
    build = lambda: jax.jit(lambda s, prompt: generate(nnx.merge(graphdef, s), prompt,
                                                       NEW_TOKENS))
    self._lowers(('generate', entry), build, (state, _int((BATCH, PROMPT))), platform)

  @parameterized.named_parameters(_cases(SOME_ENCODINGS + ('cope', 'dape')))
  @tiers.fast_cases(4)
  def test_attention_weights_lower_for_platform(self, platform, entry):
    # What the diagnostics run (eagerly there): a kernel that forms the weights.
    c, graphdef, state, _, _ = _parts(entry)
    build = lambda: jax.jit(lambda s, t: nnx.merge(graphdef, s)(t, return_weights=True))
    tokens = _int((BATCH, facts.longest_sequence(c)))
    _, picks = self._lowers(('weights', entry), build, (state, tokens), platform)
    self.assertTrue(picks)
    self.assertTrue(all(dispatch.KERNELS[k].weights for k in picks), picks)

  @parameterized.named_parameters(_cases(STACKED_ENCODINGS))
  def test_stacked_seeds_train_and_evaluation_lower_for_platform(self, platform, entry):
    # The study's default on one device (`train_seeds`, `evaluate_models`):
    # the seeds of a setup stacked in one program, laid along the mesh.
    c, graphdef, state, train_graphdef, train_state = _parts(entry)
    on_seeds, replicated = (NamedSharding(data_mesh(), spec) for spec in (P('data'), P()))
    self._lowers(('stacked_train', entry), _train_program(c, train_graphdef, vmap_seeds=True),
                 (_abstract(train_state, on_seeds, SEEDS), _int(sharding=replicated),
                  _int((SEEDS,), replicated)), platform)
    self._lowers(('stacked_evaluate', entry), _eval_program(c, graphdef, stacked=True),
                 (_abstract(state, seeds=SEEDS), KEY, _int()), platform)
    self._lowers(('stacked', entry), _eval_program(c, graphdef, generation=True, stacked=True),
                 (_abstract(state, seeds=SEEDS), KEY, _int()), platform)

  @parameterized.named_parameters(
      dict(testcase_name=_name(p, f'{d}_devices_{s}_seeds'), platform=p, devices=d, seeds=s)
      for p in PLATFORMS for d, s in ((1, 1), (2, 2), (2, 3)))
  def test_data_parallel_train_step_lowers_for_platform(self, platform, devices, seeds):
    """`train/loop.py::_train`'s layouts: the state replicated and each batch
    split along 'data', or with at least as many seeds as devices (and a
    multiple of them) the stacked seeds laid along 'data'. One device is the
    lab's own `data_mesh()`; two an abstract mesh (no devices needed)."""
    mesh = data_mesh() if devices == 1 else jax.sharding.AbstractMesh(
        (devices,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
    vmapped = seeds > 1
    seed_axis = vmapped and seeds >= devices and seeds % devices == 0
    replicated = NamedSharding(mesh, P())
    c, _, _, graphdef, state = _parts('alibi')
    build = _train_program(c, graphdef, vmap_seeds=vmapped, data_sharding=None if seed_axis
                           else NamedSharding(mesh, P('data')))
    state = (_abstract(state, NamedSharding(mesh, P('data' if seed_axis else None)), seeds)
             if vmapped else _abstract(state, replicated))
    seed = _int((seeds,) if vmapped else (), replicated)
    # Traced under the mesh, as `train/loop.py` calls it: Pallas kernels then
    # run per device (attention/partition.py).
    with jax.sharding.use_abstract_mesh(getattr(mesh, 'abstract_mesh', mesh)):
      exported, _ = self._lowers(('mesh', devices, seeds), build,
                                 (state, _int(sharding=replicated), seed), platform)
    self.assertEqual(exported.nr_devices, devices)
    if devices > 1:  # the batch, or the seeds, laid along the mesh axis
      self.assertIn('{"data"}', exported.mlir_module())

  @parameterized.named_parameters(
      dict(testcase_name=_name(p, layout), platform=p, layout=layout)
      for layout in ('fsdp', 'tensor') for p in PLATFORMS)
  @tiers.fast_cases(2)
  def test_sharded_train_step_lowers_for_platform(self, platform, layout):
    """`train.mesh='fsdp'` and `'tensor'` (`train/mesh.py`) on an abstract
    mesh of 2 devices: the state laid out by the layout's rules, the batch
    along its batch axis, traced under the rules as the loop traces it."""
    shape, names = ((2,), ('fsdp',)) if layout == 'fsdp' else ((1, 2), ('data', 'model'))
    mesh = jax.sharding.AbstractMesh(shape, names,
                                     axis_types=(jax.sharding.AxisType.Auto,) * len(shape))
    c, _, _, graphdef, state = _parts('rope')
    rules = train_mesh.RULES[layout]
    specs = jax.tree.leaves(train_mesh.state_specs(state, rules),
                            is_leaf=lambda x: isinstance(x, P))
    leaves, treedef = jax.tree.flatten(state)
    sharded = treedef.unflatten([jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                      sharding=NamedSharding(mesh, spec))
                                 for x, spec in zip(leaves, specs)])
    build = _train_program(c, graphdef, data_sharding=NamedSharding(
        mesh, P(train_mesh.batch_axis(mesh))))
    replicated = NamedSharding(mesh, P())
    with jax.sharding.use_abstract_mesh(mesh), nnx.logical_axis_rules(rules):
      exported, _ = self._lowers(('sharded', layout), build,
                                 (sharded, _int(sharding=replicated), _int(sharding=replicated)),
                                 platform)
    self.assertEqual(exported.nr_devices, 2)
    self.assertIn('{"fsdp"}' if layout == 'fsdp' else '{"model"}', exported.mlir_module())

  @parameterized.named_parameters(_cases(BLOCKWISE_ENCODINGS))
  @tiers.fast_cases(2)
  def test_long_train_step_and_evaluation_lower_blockwise_for_platform(self, platform, entry):
    # From AUTO_CHUNKED_MIN_KEYS tokens on 'auto' leaves 'dense'; a multiple
    # of 128 tokens, so the TPU kernels can take them too.
    copy, length = tasks.get_task('copy'), 1
    while (tasks.tokens_read(copy, length) < dispatch.AUTO_CHUNKED_MIN_KEYS
           or tasks.tokens_read(copy, length) % 128):
      length += 1
    c, graphdef, state, train_graphdef, train_state = _parts(entry, max_length=length)
    _, trained = self._lowers(('long_train', entry), _train_program(c, train_graphdef),
                              (train_state, _int(), _int()), platform)
    _, evaluated = self._lowers(('long', entry), _eval_program(c, graphdef),
                                (state, KEY, _int()), platform)
    for picks in (trained, evaluated):
      self.assertTrue(picks)
      self.assertNotIn('dense', picks)

  @parameterized.named_parameters(
      dict(testcase_name=_name(p, m), platform=p, method=m)
      for m in ('pi', 'ntk', 'yarn') for p in PLATFORMS)
  @tiers.fast_cases(2)
  def test_rope_context_extension_evaluation_lowers_for_platform(self, platform, method):
    c = _parts('rope')[0]
    model = nnx.eval_shape(lambda: resolve(c).build_model(0))
    train_tokens = tasks.tokens_read(tasks.get_task('copy'), c.task.train_max_length)
    scaling = RopeScaling(method, facts.longest_sequence(c) / train_tokens, train_tokens)
    with rope_scaled(model, scaling):
      graphdef, state = nnx.split(model)
    self._lowers(('rope', method), _eval_program(c, graphdef), (state, KEY, _int()), platform)

  @parameterized.named_parameters(
      dict(testcase_name=_name(p, *m), platform=p, model=m)
      for m in (('seq2seq_attention', False, 'additive'), ('seq2seq', True, 'additive'))
      for p in PLATFORMS)
  @tiers.fast_cases(2)
  def test_seq2seq_train_and_evaluation_lower_for_platform(self, platform, model):
    # experiments/seq2seq_bottleneck.py's models: trained, scored by greedy
    # decoding and, with attention, their alignments drawn.
    c, graphdef, state, train_graphdef, train_state = _parts('none', *model)
    self._lowers(('seq2seq_train', *model), _train_program(c, train_graphdef),
                 (train_state, _int(), _int()), platform)
    self._lowers(('seq2seq_evaluate', *model), _eval_program(c, graphdef),
                 (state, KEY, _int()), platform)
    if model[0] == 'seq2seq_attention':
      source = _int((1, c.task.train_max_length))
      build = lambda: jax.jit(lambda s, x, m: nnx.merge(graphdef, s).greedy_decode(
          x, m, c.task.train_max_length + 1, return_weights=True))
      self._lowers(('alignment', *model), build,
                   (state, source, source.update(dtype=jnp.bool_)), platform)

  @parameterized.named_parameters(_cases(('path', 'rope', 'rnope_swa')))
  @pytest.mark.slow  # a paper-size model traced at 2,000+ tokens: CI's slow tier
  def test_flipflop_paper_preset_builds_and_lowers_for_platform(self, platform, entry):
    """configs/flipflop.py:scale=paper, which this CPU cannot train: the
    config passes the study's checks, the 6-layer GPT-2 of width 512 is
    built (shapes only), and its train step (16 sequences of 256
    instructions) and the evaluation at its longest length (1,024
    instructions) lower for the platform."""
    c = flipflop_config.get_config(f'scale=paper,encoding={entry}')
    validate.validate_config(c, study=True)
    self.assertEqual((c.model.num_layers, c.model.d_model, c.task.train_max_length,
                      c.eval.max_length), (6, 512, 256, 1024))
    tx = make_optimizer(c.train)
    model, optimizer = nnx.eval_shape(lambda: (
        lambda m: (m, nnx.Optimizer(m, tx, wrt=nnx.Param)))(resolve(c).build_model(0)))
    graphdef, state = nnx.split(model)
    train_graphdef, train_state = nnx.split((model, optimizer))
    self._lowers(('paper_train', entry), _train_program(c, train_graphdef),
                 (train_state, _int(), _int()), platform)
    _, picks = self._lowers(('paper_evaluate', entry), _eval_program(c, graphdef),
                            (state, KEY, _int()), platform)
    # BOS and 1,024 (instruction, bit) pairs, the last bit predicted, not read.
    self.assertEqual(facts.longest_sequence(c), 2 * 1024)
    self.assertTrue(picks)
    self.assertNotIn('dense', picks)  # no [64, 8, 2048, 2048] score array

  @parameterized.parameters(*PLATFORMS)
  def test_exported_modules_call_no_host_callback(self, platform):
    # `_lowers` looks for a callback target in every module's bytes. Here: the
    # custom calls of a program with traced positions (randomized: where a
    # range check would run at run time), and that both checks see a host
    # callback where there is one (a module lowered for this CPU, which can
    # hold one).
    c, _, _, graphdef, state = _parts('rope:randomized')
    exported, _ = self._lowers(('train', 'rope:randomized'), _train_program(c, graphdef),
                               (state, _int(), _int()), platform)
    targets = _custom_call_targets(exported.mlir_module())
    self.assertEmpty({t for t in targets if 'callback' in t.lower()}, targets)
    check = lambda x: jax.debug.callback(lambda v: None, x) or x
    module = jax.jit(check).trace(_int()).lower(lowering_platforms=('cpu',)).compiler_ir()
    self.assertTrue(any('callback' in t for t in _custom_call_targets(str(module))))
    serialized = io.BytesIO()
    module.operation.write_bytecode(serialized)
    self.assertIsNotNone(CALLBACK_TARGET.search(serialized.getvalue()))



class LongAlibiTest(parameterized.TestCase):
  """ALiBi at T = 65,536, forward and backward, holds no T × T array on any
  backend: 'auto' picks a kernel that builds the bias itself there."""

  @parameterized.parameters(('tpu', 'pallas_tpu'), ('cuda', 'pallas_gpu'), ('cpu', 'chunked'))
  def test_auto_runs_alibi_at_65536_without_a_t_by_t_array(self, platform, kernel):
    t, b, h, d = 65536, 1, 8, 64
    x = jax.ShapeDtypeStruct((b, t, h, d), jnp.bfloat16)
    spec = dispatch.LinearBias(tuple(2.0 ** -(i + 1) for i in range(h)))
    loss = lambda q, k, v: jnp.sum(dispatch.scaled_dot_product_attention(
        q, k, v, causal=True, score_bias=spec).astype(jnp.float32))
    backend = BACKENDS.get(platform, platform)
    with mock.patch.object(dispatch, 'current_backend', return_value=backend):
      request = dispatch.Request(t_k=t, dtype=jnp.bfloat16, head_dim=d, causal=True,
                                 scores=(spec,), batch=b)
      self.assertEqual(dispatch.select_implementation('auto', request), kernel)
      exported = jax.export.export(
          jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=(platform,),
          disabled_checks=[TRITON_CHECK] if platform == 'cuda' else ())(x, x, x)
    sizes = [int(np.prod([int(n) for n in dims.rstrip('x').split('x')]))
             for dims in re.findall(r'tensor<((?:\d+x)+)\w+>', exported.mlir_module())]
    self.assertLess(max(sizes), t * t // 64)  # the largest: blocks, or q, k, v themselves


if __name__ == '__main__':
  absltest.main()
