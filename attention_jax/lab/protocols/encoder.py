"""The encoder protocol's loss, accuracy and scores, as DeepMind computes
them (google-deepmind/randomized_positional_encodings `experiments/
example.py` `loss_fn` / `accuracy_fn`, `tasks/task.py`, `experiments/
range_evaluation.py`).

* loss: the cross-entropy of every output slot, summed over classes and
  averaged over the batch and the slots (`jnp.mean(jnp.sum(-target *
  log_softmax(output), -1))`), every slot counted, the ones after a
  terminator too;
* accuracy of a batch: `sum(mask · correct) / sum(mask)` with the task's
  accuracy mask (`layout.encoder_batch`);
* accuracy at a length: the mean of its sub-batches' accuracies (theirs:
  512 samples in batches of 64);
* score of a run: the mean accuracy over the test lengths. Their code
  averages `accuracies[sequence_length + 1:]` of a list that starts at
  length 1, which skips the first test length (41 after training on 1–40):
  `score_official`. `score_plain` averages every test length;
* score of a setting (task × encoding): the maximum over seeds, as the
  papers report it, with the mean and standard deviation beside it.
"""

import jax
import jax.numpy as jnp
import numpy as np


def loss_and_accuracy(logits: jax.Array, batch: dict) -> tuple[jax.Array, jax.Array]:
  """logits float32 `[B, T, C]`, an `encoder_batch` -> (loss, accuracy) scalars."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  ce = -jnp.take_along_axis(logp, batch['targets'][..., None], axis=-1)[..., 0]
  out = batch['output_mask'].astype(jnp.float32)
  loss = jnp.sum(ce * out) / jnp.sum(out)
  return loss, batch_accuracy(logits, batch)


def batch_accuracy(logits: jax.Array, batch: dict) -> jax.Array:
  """`sum(mask · correct) / sum(mask)` over the batch's accuracy mask."""
  correct = (jnp.argmax(logits, axis=-1) == batch['targets']).astype(jnp.float32)
  mask = batch['accuracy_mask'].astype(jnp.float32)
  return jnp.sum(correct * mask) / jnp.sum(mask)


def run_scores(lengths, accuracies, train_max_length: int) -> dict:
  """One run's scores from its per-length accuracies (`lengths` ascending):
  `score_official` (their average, which starts at train_max_length + 2),
  `score_plain` (every length above train_max_length) and `in_range` (the
  mean over the training lengths evaluated, NaN if none)."""
  lengths, accuracies = np.asarray(lengths), np.asarray(accuracies, np.float64)
  test = lengths > train_max_length
  official = lengths > train_max_length + 1
  if not official.any():
    raise ValueError(f'no test length above {train_max_length + 1} was evaluated '
                     f'(lengths {lengths.min()} … {lengths.max()}): the official score '
                     'skips the first test length.')
  inside = ~test
  return dict(score_official=float(accuracies[official].mean()),
              score_plain=float(accuracies[test].mean()),
              in_range=float(accuracies[inside].mean()) if inside.any() else float('nan'))


def setting_scores(per_seed: list[dict], diverged_at=None) -> dict:
  """A setting's scores over its seeds' `run_scores`: for each score, the
  maximum (the papers'), the mean, the standard deviation (ddof 0) and the
  minimum (the worst seed), over
  the seeds that did not diverge (`diverged_at`: per seed None or the step
  its training loss became non-finite), and `seeds`, how many that is (NaN
  scores when none is left)."""
  diverged_at = diverged_at or [None] * len(per_seed)
  kept = [s for s, d in zip(per_seed, diverged_at) if d is None]
  out = {'seeds': len(kept)}
  for name in ('score_official', 'score_plain', 'in_range'):
    values = np.asarray([s[name] for s in kept], np.float64)
    if not len(values):
      out[name] = dict(max=float('nan'), mean=float('nan'), std=float('nan'), min=float('nan'))
      continue
    out[name] = dict(max=float(np.max(values)), mean=float(np.mean(values)),
                     std=float(np.std(values)), min=float(np.min(values)))
  return out
