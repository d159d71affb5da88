"""posttrain_jax: JAX-native RL post-training of language models.

Layers (bottom to top, see DESIGN.md section 1): objectives, io, parallel -> models -> rollout
-> envs -> train -> main. Import the subpackage you need, e.g. ``from posttrain_jax import objectives``.
"""

__version__ = "0.1.0"
