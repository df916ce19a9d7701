"""One run's config resolved once into a frozen record.

A study's config says what to run in the words a user writes
('rope:randomized', `task.pack`, `eval.lengths=()`); training, evaluation
and the tools that load a finished run need the facts those words imply:
the task object with its data options, the position ranges drawn from,
the lengths evaluated, the model's constructor arguments. `resolve`
derives each fact once, after validation, and every stage downstream reads
it from the record instead of deriving it again from the config:

    run = resolve(config)            # a validated decoder-protocol config
    model = run.build_model(seed=0)  # TransformerLM or Seq2Seq
    run.task, run.evaluation_tasks, run.eval_max_position, run.eval_lengths

`run.config` is the completed config (every option of the encoding's
`build` filled in, `facts.resolve_options`): what the run's
config.json and hash record. Plain fields (`train.learning_rate`,
`eval.batch_size`) are read from it as they are; nothing derived is.
"""

import dataclasses
import types
from typing import Mapping

import ml_collections
from flax import nnx

from attention_jax.lab import tasks
from attention_jax.lab.config.eval_lengths import bucket_floor
from attention_jax.lab.config.eval_lengths import eval_lengths
from attention_jax.lab.config import facts
from attention_jax.nn.seq2seq import Seq2Seq
from attention_jax.nn.transformer import TransformerLM


@dataclasses.dataclass(frozen=True, eq=False)
class ResolvedRun:
  """What one run of the decoder protocol trains and evaluates.

  Attributes:
    config: the completed config (encoding options filled in); not to be
      changed: the facts below were derived from it.
    task: the task with the config's data options (`task.pack`,
      `task.pack_segments`, coupled ids, Abacus offsets).
    training_task: `task` as training draws it (`Task.for_training`, e.g.
      addition's `task.carry_mix`).
    evaluation_tasks: `task`, then each of `eval.tasks` (same tokens), each
      scoring rows under its own name.
    encoding: the registry name of the encoding ('' for a seq2seq model).
    randomized_max_position: randomized positions are drawn from [0, this);
      0 when the run is not randomized.
    coupled_max_position: coupled ids lie in [0, this); 0 when not coupled.
    eval_max_position: what evaluation draws positions from:
      `randomized_max_position` with `positions.randomized_eval='random'`,
      else 0 (positions 0 … T-1).
    longest_sequence: tokens the model reads at `eval.max_length`.
    eval_lengths: the input lengths evaluated, ascending.
    bucket_floor: the `train_max` of the evaluation buckets (`evaluate.lengths`).
    model_class: `TransformerLM` or `Seq2Seq`.
    model_arguments: its constructor's keywords, all but `rngs`.
  """
  config: ml_collections.ConfigDict
  task: tasks.DecoderTask
  training_task: tasks.DecoderTask
  evaluation_tasks: tuple
  encoding: str
  randomized_max_position: int
  coupled_max_position: int
  eval_max_position: int
  longest_sequence: int
  eval_lengths: tuple
  bucket_floor: int
  model_class: type
  model_arguments: Mapping

  def build_model(self, seed: int) -> nnx.Module:
    """The model, its parameters drawn from `seed`."""
    return self.model_class(**self.model_arguments, rngs=nnx.Rngs(params=seed))


def resolve(config) -> ResolvedRun:
  """The record of `config` (one run: `task.name`, `model.kind`,
  `model.encoding`, `train.seed`), or `config` itself if it is one already.
  A ValueError names a bad value of the task's (its options, packing,
  coupled ids, `eval.tasks`); validation (`config.validate`) resolves every
  run this way and checks the record before anything runs."""
  if isinstance(config, ResolvedRun):
    return config
  config = facts.resolve_options(ml_collections.ConfigDict(config.to_dict()))
  task = facts.configured_task(config)
  randomized = facts.randomized_max_position(config)
  lengths = tuple(eval_lengths(config))
  return ResolvedRun(
      config=config, task=task, training_task=task.for_training(config.task),
      evaluation_tasks=tuple(facts.evaluation_tasks(config)),
      encoding=facts.encoding_name(config) if config.model.kind == 'transformer' else '',
      randomized_max_position=randomized,
      coupled_max_position=task.coupled_max_position,
      eval_max_position=randomized if config.positions.randomized_eval == 'random' else 0,
      longest_sequence=facts.longest_sequence(config), eval_lengths=lengths,
      bucket_floor=bucket_floor(config, lengths),
      model_class=model_class(config),
      model_arguments=types.MappingProxyType(_model_arguments(config, task)))


def model_class(config: ml_collections.ConfigDict) -> type:
  """`TransformerLM` or `Seq2Seq`, as `model.kind` says."""
  return Seq2Seq if config.model.kind in ('seq2seq', 'seq2seq_attention') else TransformerLM


def build_model_only(config: ml_collections.ConfigDict, seed: int) -> nnx.Module:
  """The model of `config` without the rest of its record: for a stored
  config whose evaluation settings this version may not take (an older
  run's), where only the model's shapes are asked (`identity`)."""
  task = facts.task_of(config)
  return model_class(config)(**_model_arguments(config, task), rngs=nnx.Rngs(params=seed))


def _model_arguments(config: ml_collections.ConfigDict, task: tasks.DecoderTask) -> dict:
  """The keywords `config.model.kind`'s class is built with, but `rngs`."""
  m = config.model
  vocab_size = task.num_symbols(config.task.vocab_size) + tasks.NUM_SPECIAL
  precision = facts.precision(config)
  if m.kind in ('seq2seq', 'seq2seq_attention'):
    return dict(vocab_size=vocab_size, embed_dim=m.d_model, hidden_dim=m.rnn_hidden_dim,
                attention=m.kind == 'seq2seq_attention', start_token=tasks.BOS,
                bidirectional=m.bidirectional, score=m.attention_score, **precision)
  abacus = facts.uses_abacus(config)
  return dict(
      vocab_size=vocab_size, d_model=m.d_model, num_heads=m.num_heads,
      num_layers=m.num_layers, mlp_dim=m.mlp_dim, encoding=facts.encoding_name(config),
      max_positions=facts.model_max_positions(config),
      num_kv_heads=m.num_kv_heads or None, sliding_window=m.sliding_window or None,
      implementation=m.attention_implementation,
      scalable_softmax=m.scalable_softmax or None,
      normalization=facts.normalization(config),
      encoding_options=facts.encoding_options(config), **precision,
      encoding_layers=facts.encoding_layers(config),
      # Abacus ids: validated against the table before compiling (run_checks).
      abacus=dict(digit_tokens=task.digit_tokens, rows=facts.abacus_embeddings(config),
                  max_k=facts.abacus_max_k(config), check_ids=False) if abacus else None)
