"""The study's diagnostics: attention maps and entropy of its trained models.

For every transformer encoding of a study, the first seed's trained model is
restored from the study's workdir (trained first if missing, exactly as the
study would), then:

* `attention_maps_LABEL.png`: heat maps per layer and head for one copy
  example at L_train and at 4 × L_train;
* `attention_entropy.png`: mean attention entropy vs query position at
  4 × L_train, one line per encoding, with the uniform-attention curve.
"""

import os
from typing import Callable

import ml_collections
import numpy as np

from attention_jax.lab import evaluate
from attention_jax.lab import models
from attention_jax.lab import tasks
from attention_jax.lab.plots import plot_attention_maps
from attention_jax.lab.plots import plot_entropy
from attention_jax.lab.study import run_configs
from attention_jax.lab.study import run_directory
from attention_jax.lab.study import run_label
from attention_jax.lab.train import train
from attention_jax.lab.validate import validate_config


def run_diagnostics(config: ml_collections.ConfigDict, workdir: str, *,
                    num_examples: int = 64,
                    log: Callable[[str], None] = print) -> dict[str, np.ndarray]:
  """Draws the figures into `workdir`; returns the entropy curves by label."""
  validate_config(config, study=True)
  seed = config.study.seeds[0]
  runs = [c for c in run_configs(config)
          if c.model.kind == 'transformer' and c.train.seed == seed
          and c.task.name == config.study.tasks[0]]
  train_max = config.task.train_max_length
  long = min(4 * train_max, config.eval.max_length)
  task = tasks.get_task(runs[0].task.name)
  train_tokens = tasks.tokens_read(task, train_max)
  curves = {}
  for c in runs:
    label = run_label(c)
    model, _ = train(c, run_directory(workdir, c), progress=config.progress)
    max_position = (models.randomized_max_position(c)
                    if c.positions.randomized_eval == 'random' else 0)
    batches = {n: evaluate.copy_examples(task, n, num_examples, vocab_size=c.task.vocab_size,
                                         seed=c.eval.seed, max_position=max_position)
               for n in (train_max, long)}
    panels, tokens = [], []
    for n, batch in batches.items():
      weights = evaluate.attention_weights(model, batch)
      panels.append((f'{label}, input length {n}', [w[0] for w in weights]))
      tokens.append(np.asarray(batch['inputs'][0]))
    path = os.path.join(workdir, f'attention_maps_{label.replace(":", "_")}.png')
    plot_attention_maps(panels, path, tokens)
    curves[label] = evaluate.entropy_by_position(model, batches[long])
    log(f'{label}: {path}; mean entropy past the training length '
        f'{curves[label][train_tokens:].mean():.2f} nats')
  plot_entropy(curves, os.path.join(workdir, 'attention_entropy.png'),
               train_tokens=train_tokens,
               title=f'{task.name}: attention entropy at input length {long} '
                     f'(trained on 1–{train_max}), seed {seed}')
  return curves
