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
mask or bias, a `DifferenceBias`'s values and a `WindowBias`'s ids, each
when it has the batch axis (a size-1 batch axis is shared).
"""

import dataclasses
from typing import Callable, Optional

import jax
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


def per_device(run: Callable, mesh, q, k, v, *, kv_lengths, mask, bias, difference,
               windows, **options):
  """`run(q, k, v, ...)` (a `Kernel.run`) on each device's share of the batch
  of `mesh`; the same arguments and result (out, None)."""
  b = q.shape[0]
  batch = P(tuple(mesh.axis_names))
  arrays = dict(q=q, k=k, v=v, kv_lengths=kv_lengths, mask=mask, bias=bias)
  if difference is not None:
    arrays.update(q_values=difference.q_values, k_values=difference.k_values)
  if windows is not None:
    arrays.update(q_positions=windows.q_positions, k_positions=windows.k_positions)
  arrays = {n: x for n, x in arrays.items() if x is not None}
  specs = {n: batch if x.shape[0] == b else P() for n, x in arrays.items()}

  def local(arrays):
    arrays = dict(arrays)
    local_difference = local_windows = None
    if difference is not None:
      local_difference = dataclasses.replace(difference, q_values=arrays.pop('q_values'),
                                             k_values=arrays.pop('k_values'))
    if windows is not None:
      local_windows = dataclasses.replace(windows, q_positions=arrays.pop('q_positions', None),
                                          k_positions=arrays.pop('k_positions', None))
    arrays.setdefault('kv_lengths', None)
    arrays.setdefault('mask', None)
    arrays.setdefault('bias', None)
    out, _ = run(arrays.pop('q'), arrays.pop('k'), arrays.pop('v'), difference=local_difference,
                 windows=local_windows, **arrays, **options)
    return out

  out = jax.shard_map(local, mesh=mesh, in_specs=(specs,), out_specs=batch,
                      check_vma=False)(arrays)
  return out, None
