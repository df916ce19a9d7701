"""The lab's optimizers: the study's AdamW with linear warm-up, cosine decay
and global-norm clipping, and DeepMind's suite's Adam at a constant rate."""

import ml_collections
import optax


def learning_rate_schedule(cfg: ml_collections.ConfigDict) -> optax.Schedule:
  """Warm-up from 0 to `cfg.learning_rate` over `cfg.warmup_steps`, then cosine
  decay to `cfg.learning_rate * cfg.final_lr_fraction` at `cfg.num_steps`."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.learning_rate,
      warmup_steps=cfg.warmup_steps, decay_steps=max(cfg.num_steps, cfg.warmup_steps + 1),
      end_value=cfg.learning_rate * cfg.final_lr_fraction)


def make_optimizer(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """`cfg` is a config's `train` section."""
  return optax.chain(
      optax.clip_by_global_norm(cfg.grad_clip_norm),
      optax.adamw(learning_rate_schedule(cfg), b1=cfg.adam_b1, b2=cfg.adam_b2,
                  weight_decay=cfg.weight_decay))


def adam_as_deepmind(grad_clip_norm: float, learning_rate: float
                     ) -> optax.GradientTransformation:
  """The suite's, as their `experiments/training.py`:
  `optax.chain(clip_by_global_norm(max_grad_norm), adam(lr))` (their
  `max_grad_norm` is our `train.grad_clip_norm`)."""
  return optax.chain(optax.clip_by_global_norm(grad_clip_norm), optax.adam(learning_rate))
