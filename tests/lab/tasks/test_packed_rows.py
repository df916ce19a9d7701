"""Packed rows with segment ids (`task.pack_segments`, tasks/packed_rows.py):
each example alone, the loss and gradients of the same examples padded."""

import os
import subprocess
import sys
import textwrap

import chex
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import pytest

from attention_jax.lab.config import facts
from attention_jax.lab.protocols import decoder
from attention_jax.lab import tasks
from attention_jax.lab import train
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.evaluate.scoring import masked_metrics
from attention_jax.lab.evaluate.scoring import segment_exact_match
from attention_jax.lab.tasks import packed_rows
from attention_jax.lab.config.validate import validate_config
from attention_jax.lab.config.resolved import resolve
from configs import addition as addition_config
from configs import copy as copy_config
from tests import tiers


def _config(task: str, encoding: str, pack_segments: int = 2):
  if task == 'addition':
    c = addition_config.get_config('scale=tiny')
    c.model.encoding, c.task.train_max_length = encoding, 3
  else:
    c = copy_config.get_config(f'scale=tiny,encoding={encoding},task={task}')
  c.task.pack_segments = pack_segments
  return c


def _batch(c, step: int = 0, batch_size: int = 4) -> dict:
  return tasks.train_batch(
      facts.configured_task(c), 0, jnp.int32(step), batch_size=batch_size,
      min_length=c.task.train_min_length, max_length=c.task.train_max_length,
      vocab_size=c.task.vocab_size, max_position=facts.randomized_max_position(c))


def _unpacked(batch: dict) -> tuple[dict, list]:
  """The packed batch's examples one per row, each at the start of its own
  row of PAD (positions sliced with it when the batch has them), and the
  (row, start, end) each came from."""
  ids = np.asarray(batch['segment_ids'])
  found = [(b, int(np.argmax(ids[b] == i)), int(np.sum(ids[b] == i)))
           for b in range(ids.shape[0]) for i in range(1, ids.max() + 1) if np.any(ids[b] == i)]
  width = max(size for _, _, size in found)
  keys = [k for k in ('inputs', 'targets', 'loss_mask', 'positions') if k in batch]
  out = {k: np.zeros((len(found), width), np.asarray(batch[k]).dtype) for k in keys}
  for e, (b, start, size) in enumerate(found):
    for k in keys:
      out[k][e, :size] = np.asarray(batch[k])[b, start:start + size]
  return {k: jnp.asarray(v) for k, v in out.items()}, found


def _loss_and_grads(model, batch):
  def loss(model):
    logits = decoder.forward_batch(model, batch)
    return masked_metrics(logits, batch)['loss'], logits
  (value, logits), grads = nnx.value_and_grad(loss, has_aux=True)(model)
  return value, logits, nnx.to_pure_dict(grads)


class PackedRowsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('copy_rope', 'copy', 'rope'), ('copy_coupled', 'copy', 'windowed_rope:coupled'),
      ('reverse_alibi', 'reverse', 'alibi'), ('duplicate_fire', 'duplicate', 'fire'),
      ('addition_learned', 'addition', 'learned'),
      ('reverse_randomized', 'reverse', 'rope:randomized'))
  @tiers.fast_cases(2)  # copy with RoPE and with coupled ids; the others in the slow tier
  def test_packed_rows_equal_each_example_alone(self, task, encoding):
    c = _config(task, encoding)
    model = resolve(c).build_model(0)
    packed = _batch(c)
    unpacked, found = _unpacked(packed)
    self.assertGreater(len(found), 4)  # more examples than rows: something was packed
    self.assertEqual('positions' in packed, ':' in encoding)
    loss, logits, grads = _loss_and_grads(model, packed)
    alone_loss, alone_logits, alone_grads = _loss_and_grads(model, unpacked)
    # Document by document: each scored logit is the one its example has alone.
    mask = np.asarray(packed['loss_mask'])
    for e, (b, start, size) in enumerate(found):
      scored = mask[b, start:start + size]
      np.testing.assert_allclose(np.asarray(logits)[b, start:start + size][scored],
                                 np.asarray(alone_logits)[e, :size][scored], atol=2e-5)
    # The batch: the mean over every example's output tokens, as padded one per row.
    np.testing.assert_allclose(loss, alone_loss, rtol=1e-5)
    chex.assert_trees_all_close(grads, alone_grads, atol=2e-6, rtol=1e-4)

  def test_packed_rows_layout_keeps_every_example(self):
    c = _config('copy', 'rope', pack_segments=3)
    batch = _batch(c, step=5, batch_size=8)
    ids, inputs = np.asarray(batch['segment_ids']), np.asarray(batch['inputs'])
    row = packed_rows.row_length(facts.configured_task(c), c.task.train_max_length)
    self.assertEqual(inputs.shape, (8, row - 1))
    examples = 0
    for b in range(8):
      n = ids[b].max()
      self.assertGreaterEqual(n, 1)
      # ids 1 … n in order, then 0 on the PAD at the end only.
      runs = [int(i) for i in ids[b][np.r_[True, ids[b][1:] != ids[b][:-1]]]]
      self.assertEqual(runs, list(range(1, n + 1)) + ([0] if 0 in ids[b] else []))
      np.testing.assert_array_equal(inputs[b][ids[b] == 0], tasks.PAD)
      for i in range(1, n + 1):
        tokens = inputs[b][ids[b] == i]
        sep = int(np.argmax(tokens == tasks.SEP))
        self.assertEqual(tokens[0], tasks.BOS)
        x, y = tokens[1:sep], tokens[sep + 1:sep + 1 + sep - 1]
        np.testing.assert_array_equal(x, y)  # copy: the output is the input
      examples += n
    self.assertGreater(examples, 8)
    # Fewer PAD than padding one example per row (the point of packing).
    padded = tasks.train_batch(tasks.get_task('copy'), 0, jnp.int32(5), batch_size=examples,
                               min_length=1, max_length=c.task.train_max_length,
                               vocab_size=c.task.vocab_size)
    self.assertLess(np.mean(inputs == tasks.PAD), np.mean(np.asarray(padded['inputs']) ==
                                                           tasks.PAD))

  def test_packed_rows_assign_in_stream_order(self):
    rows, starts = packed_rows.assign_rows(jnp.array([5, 7, 9, 3, 6]), 2, 12)
    np.testing.assert_array_equal(rows, [0, 0, 1, 1, 2])  # 6 finds no row: dropped
    np.testing.assert_array_equal(starts[:4], [0, 5, 0, 9])
    rows, starts = packed_rows.assign_rows(jnp.array([10, 5, 5, 5]), 4, 12)
    np.testing.assert_array_equal(rows, [0, 1, 1, 2])  # the stream ran out: row 3 empty
    np.testing.assert_array_equal(starts, [0, 0, 5, 0])

  def test_packed_rows_exact_match_per_example(self):
    ids = jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
    mask = jnp.array([[0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 1, 1]], bool)
    targets = jnp.array([[5, 6, 7, 5, 6, 0], [5, 6, 7, 8, 9, 10]])
    predictions = targets.at[0, 4].set(1)  # example 2 of row 0 wrong
    exact, examples = segment_exact_match(
        predictions, dict(segment_ids=ids, loss_mask=mask, targets=targets))
    self.assertEqual(float(examples), 3.0)
    self.assertAlmostEqual(float(exact), 2 / 3, places=6)

  def test_packed_rows_tiny_training_runs(self):
    c = _config('copy', 'rope', pack_segments=1)
    c.train.update(num_steps=4, log_every=4)
    _, metrics = train.train(c, progress=False)
    self.assertTrue(np.isfinite(metrics['loss']))
    self.assertGreaterEqual(metrics['examples'], c.train.batch_size)

  @pytest.mark.slow  # a subprocess of 4 devices; packed batches are checked above
  def test_packed_rows_four_devices_equal_one_device(self):
    script = textwrap.dedent('''
        import jax
        from attention_jax.lab import train
        from configs import copy as copy_config
        c = copy_config.get_config('scale=tiny,encoding=rope')
        c.task.pack_segments = 2
        c.train.update(num_steps=4, log_every=4)
        print('LOSS', jax.device_count(), train.train(c, progress=False)[1]['loss'])
        ''')
    losses = {}
    for devices in (1, 4):
      env = dict(os.environ, JAX_PLATFORMS='cpu',
                 XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}')
      out = subprocess.run([sys.executable, '-c', script], env=env, capture_output=True,
                           text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
                               os.path.abspath(__file__))))), check=False, timeout=240)
      self.assertEqual(out.returncode, 0, out.stderr[-3000:])
      count, loss = out.stdout.split('LOSS')[1].split()[:2]
      self.assertEqual(int(count), devices)
      losses[devices] = float(loss)
    self.assertAlmostEqual(losses[4], losses[1], places=5)

  @parameterized.named_parameters(
      ('negative', dict(pack_segments=-1), r'task.pack_segments=-1 must be an integer >= 0'),
      ('bool', dict(pack_segments=True), r'task.pack_segments=True must be an integer'),
      ('with_pack', dict(pack_segments=2, pack=3), r'task.pack_segments=2 and task.pack=3 do '
       'not combine'))
  def test_packed_rows_config_errors(self, fields, message):
    c = _config('copy', 'rope', pack_segments=0)
    c.task.update(fields)
    with self.assertRaisesRegex(ConfigError, message):
      validate_config(c)

  def test_packed_rows_refused_with_abacus(self):
    c = addition_config.get_config('scale=tiny,encoding=fire:abacus')
    c.task.pack_segments = 1
    with self.assertRaisesRegex(ConfigError, r'pack_segments=1 with Abacus embeddings'):
      validate_config(c)


if __name__ == '__main__':
  absltest.main()
