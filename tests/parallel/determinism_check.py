"""Subprocess half of test_determinism.py: one gradient of the tiny preset's next-token loss on
a fixed batch (64 x 48 tokens: the weight gradients contract over 3,072 tokens, the sum Eigen
splits between threads), then the same step's greedy tokens, printed as one hash per part.

argv: CPU_THREADS (-1: leave the pool alone) [CORE]: CORE pins the process to that one core
first (a one-core machine). XLA_FLAGS come from the environment; ``import posttrain_jax`` adds
the library's flags.
"""

import hashlib
import json
import os
import sys

if len(sys.argv) > 2:
  os.sched_setaffinity(0, {int(sys.argv[2])})

import posttrain_jax  # noqa: E402, F401  (the library's XLA flags, before JAX starts)
from posttrain_jax.parallel import host  # noqa: E402

threads = int(sys.argv[1])
if threads >= 0:
  host.set_cpu_threads(threads)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from posttrain_jax import models  # noqa: E402

model = models.Decoder(models.preset("tiny", vocab_size=40), rngs=nnx.Rngs(0))
tokens = jax.random.randint(jax.random.key(1), (64, 48), 3, 40)


def loss_fn(m):
  logits = m(tokens[:, :-1]).logits
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


loss, grads = nnx.jit(nnx.value_and_grad(loss_fn))(model)
greedy = jnp.argmax(nnx.jit(lambda m: m(tokens).logits)(model), axis=-1)


def digest(tree) -> str:
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(tree):
    h.update(np.asarray(leaf).tobytes())
  return h.hexdigest()[:16]


print(
  json.dumps(
    {
      "loss": digest(loss),
      "grads": digest(nnx.state(grads)),
      "greedy": digest(greedy),
      "threads": host.cpu_threads(),
    }
  )
)
