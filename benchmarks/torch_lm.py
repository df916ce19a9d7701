"""PyTorch's twin of the study's TransformerLM, for side-by-side benchmarks:
the same architecture (pre-LN, GELU-tanh MLP, split-halves RoPE, untied
output), weights copied from ours by `load`."""

import numpy as np
import torch


class TorchLM(torch.nn.Module):
  """TransformerLM's twin: weights copied from ours by `load`."""

  def __init__(self, vocab, d, heads, layers, mlp):
    super().__init__()
    self.heads, self.d = heads, d
    self.embed = torch.nn.Embedding(vocab, d)
    self.blocks = torch.nn.ModuleList()
    for _ in range(layers):
      block = torch.nn.ModuleDict(dict(
          ln1=torch.nn.LayerNorm(d, eps=1e-6), q=torch.nn.Linear(d, d, bias=False),
          k=torch.nn.Linear(d, d, bias=False), v=torch.nn.Linear(d, d, bias=False),
          o=torch.nn.Linear(d, d, bias=False), ln2=torch.nn.LayerNorm(d, eps=1e-6),
          mlp_in=torch.nn.Linear(d, mlp), mlp_out=torch.nn.Linear(mlp, d)))
      self.blocks.append(block)
    self.final = torch.nn.LayerNorm(d, eps=1e-6)
    self.unembed = torch.nn.Linear(d, vocab)

  def rope(self, x):  # x [B, H, T, D], split halves
    t, hd = x.shape[2], x.shape[3]
    theta = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = (torch.arange(t, dtype=torch.float64)[:, None] * theta).float()
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

  def forward(self, tokens):
    b, t = tokens.shape
    x = self.embed(tokens)
    split = lambda h: h.view(b, t, self.heads, -1).transpose(1, 2)
    for blk in self.blocks:
      h = blk['ln1'](x)
      q, k, v = split(blk['q'](h)), split(blk['k'](h)), split(blk['v'](h))
      o = torch.nn.functional.scaled_dot_product_attention(
          self.rope(q), self.rope(k), v, is_causal=True)
      x = x + blk['o'](o.transpose(1, 2).reshape(b, t, self.d))
      h = blk['ln2'](x)
      x = x + blk['mlp_out'](torch.nn.functional.gelu(blk['mlp_in'](h), approximate='tanh'))
    return self.unembed(self.final(x))

  def load(self, ours):
    t = lambda a: torch.from_numpy(np.ascontiguousarray(np.asarray(a)))

    def lin(layer, kernel, bias=None):  # ours [in, …out] -> torch [out, in]
      layer.weight.data.copy_(t(np.asarray(kernel).reshape(layer.in_features, -1).T))
      if bias is not None:
        layer.bias.data.copy_(t(bias))

    self.embed.weight.data.copy_(t(ours.embed.embedding[...]))
    for blk, o in zip(self.blocks, ours.blocks):
      a = o.attention
      for name in ('q', 'k', 'v'):
        lin(blk[name], getattr(a, f'W_{name.upper()}').kernel[...])
      lin(blk['o'], np.asarray(a.W_O.kernel[...]).reshape(self.d, self.d))
      for ln, theirs in ((blk['ln1'], o.attention_norm), (blk['ln2'], o.mlp_norm)):
        ln.weight.data.copy_(t(theirs.scale[...]))
        ln.bias.data.copy_(t(theirs.bias[...]))
      lin(blk['mlp_in'], o.mlp_in.kernel[...], o.mlp_in.bias[...])
      lin(blk['mlp_out'], o.mlp_out.kernel[...], o.mlp_out.bias[...])
    self.final.weight.data.copy_(t(ours.final_norm.scale[...]))
    self.final.bias.data.copy_(t(ours.final_norm.bias[...]))
    lin(self.unembed, ours.unembed.kernel[...], ours.unembed.bias[...])
