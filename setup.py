"""posttrain_jax: a JAX-native research library for RL post-training of language models.

The package metadata and dependency ranges live in pyproject.toml; this shim keeps
``python setup.py ...`` and older tools working."""

import setuptools

setuptools.setup()
