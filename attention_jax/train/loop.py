"""The training loop: build, compile once, step, log."""

import functools
import json
import os
import time
from typing import Optional

import jax
import jax.numpy as jnp
import ml_collections
import optax
import tqdm
from flax import nnx

from attention_jax import tasks
from attention_jax.nn.seq2seq import Seq2Seq
from attention_jax.nn.transformer import TransformerLM
from attention_jax.train.optimizer import learning_rate_schedule
from attention_jax.train.optimizer import make_optimizer
from attention_jax.train.step import compiled_step


def model_max_length(config: ml_collections.ConfigDict) -> int:
  """Positions the model must cover: the longest evaluation sequence, unless
  `config.model.max_length` says otherwise (validated elsewhere)."""
  if config.model.max_length:
    return config.model.max_length
  task = tasks.get_task(config.task.name)
  return tasks.sequence_length(task, config.eval.max_length) - 1


MODEL_KINDS = ('transformer', 'seq2seq', 'seq2seq_attention')


def build_model(config: ml_collections.ConfigDict, seed: int) -> nnx.Module:
  """The model `config.model.kind` names, parameters drawn from `seed`."""
  m = config.model
  if m.kind in ('seq2seq', 'seq2seq_attention'):
    return Seq2Seq(
        vocab_size=config.task.vocab_size + tasks.NUM_SPECIAL, embed_dim=m.d_model,
        hidden_dim=m.rnn_hidden_dim, attention=m.kind == 'seq2seq_attention',
        bidirectional=m.bidirectional, score=m.attention_score,
        rngs=nnx.Rngs(params=seed))
  return TransformerLM(
      vocab_size=config.task.vocab_size + tasks.NUM_SPECIAL, d_model=m.d_model,
      num_heads=m.num_heads, num_layers=m.num_layers, mlp_dim=m.mlp_dim,
      encoding=m.encoding, max_length=model_max_length(config),
      rngs=nnx.Rngs(params=seed))


def train(config: ml_collections.ConfigDict, workdir: Optional[str] = None,
          *, progress: bool = True, tx: Optional[optax.GradientTransformation] = None,
          ) -> tuple[nnx.Module, dict[str, float]]:
  """Trains one model; returns it and the last step's metrics.

  `tx` defaults to `make_optimizer(config.train)`. The compiled step is cached
  on the optimizer object, so a sweep passes one `tx` to all its runs to
  compile once per architecture instead of once per run.

  Writes one JSON line per step to `workdir/metrics.jsonl` when `workdir` is
  given. Host-device syncs happen every `config.train.log_every` steps only.
  """
  t_cfg = config.train
  task = tasks.get_task(config.task.name)
  model = build_model(config, t_cfg.seed)
  optimizer = nnx.Optimizer(model, tx or make_optimizer(t_cfg), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  step_fn = functools.partial(
      compiled_step, seed=jnp.int32(t_cfg.seed), graphdef=graphdef, task=task,
      batch_size=t_cfg.batch_size, min_length=config.task.train_min_length,
      max_length=config.task.train_max_length, vocab_size=config.task.vocab_size,
      layout=model.batch_layout)
  schedule = learning_rate_schedule(t_cfg)

  log_file = None
  if workdir:
    os.makedirs(workdir, exist_ok=True)
    log_file = open(os.path.join(workdir, 'metrics.jsonl'), 'w')
  bar = tqdm.tqdm(total=t_cfg.num_steps, disable=not progress, unit='step',
                  dynamic_ncols=True, leave=False)
  pending, last, start = [], {}, time.perf_counter()
  try:
    for step in range(t_cfg.num_steps):
      state, metrics = step_fn(state, jnp.int32(step))
      pending.append(metrics)
      if len(pending) == t_cfg.log_every or step == t_cfg.num_steps - 1:
        elapsed = time.perf_counter() - start
        for i, m in enumerate(jax.device_get(pending)):
          s = step + 1 - len(pending) + i
          last = {k: float(v) for k, v in m.items()}
          last.update(step=s, learning_rate=float(schedule(s)),
                      steps_per_second=(step + 1) / elapsed)
          if log_file:
            log_file.write(json.dumps(last) + '\n')
        bar.update(len(pending))
        bar.set_postfix(loss=f"{last['loss']:.3f}", acc=f"{last['token_accuracy']:.3f}",
                        steps_s=f"{last['steps_per_second']:.0f}")
        pending = []
  finally:
    bar.close()
    if log_file:
      log_file.close()
  model, _ = nnx.merge(graphdef, state)
  return model, last
