"""Independent NumPy float64 references, written from the papers' formulas.

They share no code with the library: loops and plain NumPy, for tests only.
"""

import math

import numpy as np


def attention(q, k, v, mask=None, bias=None):
  """One head: q [Tq, D], k [Tk, D], v [Tk, Dv] -> (out, weights), float64.

  A row with no attended key gets zero weights (the library's convention).
  """
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  scores = q @ k.T / math.sqrt(q.shape[1])
  if bias is not None:
    scores = scores + np.asarray(bias, np.float64)
  weights = np.zeros_like(scores)
  mask = np.ones(scores.shape, bool) if mask is None else np.broadcast_to(mask, scores.shape)
  for i in range(scores.shape[0]):
    keep = mask[i]
    if keep.any():
      row = scores[i][keep]
      e = np.exp(row - row.max())
      weights[i][keep] = e / e.sum()
  return weights @ v, weights


def sinusoidal(positions, dim):
  pe = np.zeros((len(positions), dim))
  for row, pos in enumerate(positions):
    for j in range(dim):
      i = j // 2
      angle = pos / 10000.0 ** (2 * i / dim)
      pe[row, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
  return pe


def rope(x, positions, base=10000.0):
  """Split-halves RoPE of x [T, H, D] at positions [T], float64."""
  x = np.asarray(x, np.float64)
  d = x.shape[-1]
  out = np.empty_like(x)
  for t, pos in enumerate(positions):
    for i in range(d // 2):
      theta = base ** (-2 * i / d)
      c, s = math.cos(pos * theta), math.sin(pos * theta)
      a, b = x[t, :, i], x[t, :, i + d // 2]
      out[t, :, i] = a * c - b * s
      out[t, :, i + d // 2] = b * c + a * s
  return out


def alibi_slopes(n):
  """The ALiBi authors' recursive rule, restated."""
  def power_of_2(n):
    start = 2 ** (-(2 ** -(math.log2(n) - 3)))
    return [start * start ** i for i in range(n)]
  if math.log2(n).is_integer():
    return power_of_2(n)
  closest = 2 ** math.floor(math.log2(n))
  return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n - closest]
