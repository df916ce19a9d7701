"""Custom-call kernels on a device mesh.

XLA partitions ordinary ops across a mesh itself, but not a Pallas kernel's
custom call (Mosaic on TPU refuses: "cannot be automatically partitioned";
Triton on GPU would run the whole batch on every device). So when a call is
traced under a mesh of more than one device (`jax.set_mesh(mesh)`, as the
lab's training does), the dispatcher runs such a kernel once per device on
its share of the batch, with `jax.shard_map`: the batch axis split over all
the mesh's axes, everything else whole. Attention never mixes examples, so
this is exact; it needs the batch to be a multiple of the mesh's size.

The kernels' own arrays are the ones split: q, k, v, kv_lengths, a dense
mask, and the array fields of every score spec (a `DenseBias`'s bias, a
`DifferenceBias`'s values, a `WindowBias`'s ids, any kind's), each when it
has the batch axis (a size-1 batch axis is shared).
"""

import dataclasses
from typing import Callable, Optional

import jax
import numpy as np
from jax.sharding import PartitionSpec as P


def context_mesh() -> Optional[jax.sharding.AbstractMesh]:
  """The mesh a call is traced under when it has more than one device, else None."""
  mesh = jax.sharding.get_abstract_mesh()
  return None if mesh.empty or mesh.size == 1 else mesh


def batch_obstacle(batch: int, mesh) -> Optional[str]:
  """Why a kernel run per device cannot take this batch on `mesh` (None: it can)."""
  if mesh is None or batch % mesh.size == 0:
    return None
  return (f'a batch of {batch} on a mesh of {mesh.size} devices (run per device, it needs '
          'a batch that is a multiple of the mesh size)')


def spec_arrays(spec) -> dict:
  """The array fields of a score spec, by name (None fields left out): the
  ones with the batch as their leading axis, size B or 1 (`scores.py`)."""
  return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
          if isinstance(getattr(spec, f.name), (jax.Array, np.ndarray))}


def per_device(run: Callable, mesh, q, k, v, *, kv_lengths, mask, scores, **options):
  """`run(q, k, v, ...)` (a `Kernel.run`) on each device's share of the batch
  of `mesh`; the same arguments and result (out, None). Every score spec's
  array fields are split along their batch axis (or shared, of size 1)."""
  b = q.shape[0]
  batch = P(tuple(mesh.axis_names))
  arrays = dict(q=q, k=k, v=v, kv_lengths=kv_lengths, mask=mask)
  arrays = {n: x for n, x in arrays.items() if x is not None}
  arrays['scores'] = [spec_arrays(s) for s in scores]
  specs = jax.tree.map(lambda x: batch if x.shape[0] == b else P(), arrays)

  def local(arrays):
    arrays = dict(arrays)
    local_scores = tuple(dataclasses.replace(spec, **local_arrays)
                         for spec, local_arrays in zip(scores, arrays.pop('scores')))
    arrays.setdefault('kv_lengths', None)
    arrays.setdefault('mask', None)
    out, _ = run(arrays.pop('q'), arrays.pop('k'), arrays.pop('v'), scores=local_scores,
                 **arrays, **options)
    return out

  out = jax.shard_map(local, mesh=mesh, in_specs=(specs,), out_specs=batch,
                      check_vma=False)(arrays)
  return out, None
