"""The task's own ceiling: which evaluation strings a k-gram lookup can copy.

A model that is not told where to look copies by content: it finds the last
few tokens it wrote somewhere earlier in the sequence and writes what came
next there (an induction head over k-grams). That rule is unambiguous for a
string only if no context of k tokens occurs before two outputs with
different next tokens. In `BOS x SEP y EOS`, for every output position t
(y and EOS; the task's `loss_mask`), the context is the k tokens before it;
the example is *k-unambiguous* when every two output positions with the same
context have the same target. For copy this is "no k-gram of x repeats with
another successor" (the end of x counts: its successor is EOS in y), for
reverse the same with predecessors, and duplicate is ambiguous for every
k <= n (the last k-gram of x ends both copies, once before x_1, once before
EOS): a lookup cannot count.

`ceiling` is the fraction of k-unambiguous strings per k: at most that
fraction of strings can be copied exactly by a k-gram lookup, whatever the
model. `first_errors` sorts a model's failures: the first wrong prediction
(the same under teacher forcing and greedy generation: the prefix before it
is right) is an *early EOS*, a *missed EOS* (EOS due, another token
written), *ambiguity* (the token that follows another earlier occurrence of
the last k >= 2 tokens: a repeated k-gram, as the ceiling counts) or
*drift* (none of these).

Arrays are a decoder-only batch's, `[B, T]`: `inputs` (the token before each
target), `targets`, `loss_mask` (True on outputs).
"""

from typing import Sequence

import numpy as np

from attention_jax.lab.evaluate.lengths import evaluation_strings

KS = (1, 2, 3, 4, 5, 6)  # context lengths reported
CATEGORIES = ('ambiguity', 'early EOS', 'missed EOS', 'drift')
MIN_AMBIGUOUS_K = 2  # a single repeated symbol is no evidence of a k-gram lookup


def same_context(inputs: np.ndarray, max_k: int) -> np.ndarray:
  """bool `[max_k, B, T, T]`: entry `[k-1, b, t, u]` is True when the k
  tokens before targets t and u (`inputs[t-k+1 … t]`, `inputs[u-k+1 … u]`)
  are equal; before the start of the sequence both read a marker, so two
  contexts cut by the start match if their visible tokens do."""
  inputs = np.asarray(inputs)
  b, t = inputs.shape
  padded = np.concatenate([np.full((b, max_k - 1), -1, inputs.dtype), inputs], axis=1)
  eq = np.ones((b, t, t), bool)
  out = np.empty((max_k, b, t, t), bool)
  for k in range(1, max_k + 1):
    shifted = padded[:, max_k - k:max_k - k + t]  # inputs[t - k + 1]
    eq &= shifted[:, :, None] == shifted[:, None, :]
    out[k - 1] = eq
  return out


def unambiguous(inputs, targets, loss_mask, ks: Sequence[int] = KS) -> np.ndarray:
  """bool `[B, len(ks)]`: whether each example is k-unambiguous (module
  docstring) for each k of `ks`."""
  targets, mask = np.asarray(targets), np.asarray(loss_mask, bool)
  same = same_context(inputs, max(ks))
  pairs = mask[:, :, None] & mask[:, None, :] & (targets[:, :, None] != targets[:, None, :])
  return np.stack([~np.any(same[k - 1] & pairs, axis=(1, 2)) for k in ks], axis=1)


def ceiling(inputs, targets, loss_mask, ks: Sequence[int] = KS) -> dict[int, float]:
  """k -> the fraction of k-unambiguous examples."""
  ok = unambiguous(inputs, targets, loss_mask, ks)
  return {k: float(ok[:, i].mean()) for i, k in enumerate(ks)}


def first_errors(inputs, targets, loss_mask, predictions, *, eos: int,
                 max_k: int = max(KS)) -> list[dict]:
  """For each example: `{'exact': bool, 'category': one of CATEGORIES or None,
  'position': first wrong target index or None, 'k': the longest earlier
  context (up to max_k) matching the one before the error whose next token
  is the one predicted (0: none)}`. `predictions` int `[B, T]` are aligned
  with `targets` (teacher-forced argmax)."""
  inputs, targets = np.asarray(inputs), np.asarray(targets)
  mask, predictions = np.asarray(loss_mask, bool), np.asarray(predictions)
  wrong = mask & (predictions != targets)
  same = same_context(inputs, max_k)
  out = []
  for b in range(inputs.shape[0]):
    if not wrong[b].any():
      out.append(dict(exact=True, category=None, position=None, k=0))
      continue
    t = int(np.argmax(wrong[b]))
    p = predictions[b, t]
    # Earlier positions u < t whose next token (targets[u]) is the one written.
    followers = np.arange(inputs.shape[1]) < t
    followers &= targets[b] == p
    k = 0
    for kk in range(1, max_k + 1):
      if np.any(same[kk - 1, b, t] & followers):
        k = kk
    if p == eos:
      category = 'early EOS'
    elif targets[b, t] == eos:
      category = 'missed EOS'
    elif k >= MIN_AMBIGUOUS_K:
      category = 'ambiguity'
    else:
      category = 'drift'
    out.append(dict(exact=False, category=category, position=t, k=k))
  return out


def failure_summary(errors: Sequence[dict]) -> dict[str, float]:
  """`first_errors`' list -> fractions of all examples: 'exact' and one per
  CATEGORIES entry (they sum to 1), and 'mean_k_ambiguity' (mean k of the
  ambiguity failures; 0 if none)."""
  n = max(len(errors), 1)
  out = {'exact': sum(e['exact'] for e in errors) / n}
  for c in CATEGORIES:
    out[c] = sum(e['category'] == c for e in errors) / n
  ks = [e['k'] for e in errors if e['category'] == 'ambiguity']
  out['mean_k_ambiguity'] = float(np.mean(ks)) if ks else 0.0
  return out


def ceiling_rows(task, lengths: Sequence[int], *, train_max: int, num_samples: int,
                 vocab_size: int, eval_seed: int = 12345, batch_size: int = 256,
                 ks: Sequence[int] = KS) -> list[dict]:
  """Per (length, k): `{'task', 'length', 'k', 'unambiguous'}`, the ceiling
  on the very strings the study evaluates every model on
  (`lengths.evaluation_strings`)."""
  strings = evaluation_strings(task, lengths, train_max=train_max, num_samples=num_samples,
                               vocab_size=vocab_size, eval_seed=eval_seed,
                               batch_size=batch_size)
  rows = []
  for n in sorted(strings):
    s = strings[n]
    for k, value in ceiling(s['inputs'], s['targets'], s['loss_mask'], ks).items():
      rows.append(dict(task=task.name, length=n, k=k, unambiguous=value))
  return rows
