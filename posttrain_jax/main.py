"""Entry point: ``python -m posttrain_jax.main --config=experiments/NAME.py[:ARG] --workdir=DIR``.

Fields of the config are overridden on the command line, e.g. ``--config.rl.lr=3e-4``.
Errors in the config, the workdir or a checkpoint print one line and exit with status 2.
"""

import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, results.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  # Imported here so `--help` and flag errors answer before JAX starts.
  from posttrain_jax.io import CheckpointError
  from posttrain_jax.train import ConfigError, TrainingError, run
  if _CONFIG.value is None:
    _fail("no --config given; pass --config=experiments/quickstart.py")
  try:
    run(_CONFIG.value, _WORKDIR.value)
  except (ConfigError, CheckpointError, TrainingError) as e:
    _fail(str(e))


def _fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


if __name__ == "__main__":
  app.run(main)
