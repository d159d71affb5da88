"""posttrain_jax: a JAX-native research library for RL post-training of language models."""
import setuptools

INSTALL_REQUIRES = [
    "jax>=0.10.2,<0.11",
    "jaxlib>=0.10.2,<0.11",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "chex>=0.1.92,<0.2",
    "ml-collections>=1.1.0,<2",
    "transformers>=5.0,<6",
    "tokenizers>=0.22,<0.24",
    "safetensors>=0.6,<0.9",
    "absl-py>=2.1,<3",
    "numpy>=2.0,<3",
    "tqdm>=4.66,<5",
    "matplotlib>=3.9,<4",
    "tensorboardX>=2.6.2,<3",
    # The static dataset format (envs/tfds_data.py): TFDS datasets in array_record format, read
    # through grain; none of them needs TensorFlow.
    "tensorflow-datasets>=4.9.9,<5",
    "grain>=0.2.12,<0.3",
    "array-record>=0.8.1,<0.9",
    # Math answer checking (rewards/math_answers.py); it pins latex2sympy2_extended==1.11.0.
    "math-verify[antlr4_13_2]==0.9.0",
]

TEST_REQUIRES = [
    "pytest>=8.0,<10",
    "pytest-xdist>=3.6,<4",
    "hypothesis>=6.100,<7",
    "torch==2.13.0",
]

setuptools.setup(
    name="posttrain_jax",
    version="0.1.0",
    description="JAX-native RL post-training of language models.",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=setuptools.find_packages(include=["posttrain_jax", "posttrain_jax.*"]),
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": TEST_REQUIRES},
)
