"""Small array ops shared by the model files.

``dense`` is every projection of the models. It contracts as one 2-D matmul
(``[rows, in] @ [in, out]``) instead of an ``einsum`` over the batch and length axes: XLA:CPU
lowers the weight gradient of ``einsum('btd,df->btf')`` (a dot with two contracting
dimensions) to a slow path, and the tiny model's whole backward pass ran 15-25x slower than its
forward; as 2-D matmuls the MLP's backward is ~3x its forward (measured in
``tests/models/test_transformer.py`` only as equality; speed in ``scripts/bench.py``).
"""

import math

import jax


def dense(x: jax.Array, w: jax.Array, n_in: int = 1) -> jax.Array:
  """Contracts the last ``n_in`` axes of ``x`` with the first ``n_in`` axes of ``w``.

  ``x [..., *in]``, ``w [*in, *out]`` -> ``[..., *out]`` (``einsum('...i,io->...o')`` with the
  ``in`` and ``out`` axes flattened), as one 2-D matmul.
  """
  lead, inner = x.shape[:x.ndim - n_in], x.shape[x.ndim - n_in:]
  if tuple(w.shape[:n_in]) != tuple(inner):
    raise ValueError(f"dense: x {x.shape} and w {w.shape} do not share the {n_in} contracted "
                     "axes")
  out = w.shape[n_in:]
  y = x.reshape(math.prod(lead), math.prod(inner)) @ w.reshape(math.prod(inner), math.prod(out))
  return y.reshape(*lead, *out)
