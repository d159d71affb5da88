"""Entry point: ``python -m posttrain_jax.main --config=experiments/NAME.py[:ARG] --workdir=DIR``.

Fields of the config are overridden on the command line, e.g. ``--config.rl.lr=3e-4``.
Errors in the config, the workdir or a checkpoint print one line and exit with status 2.

Multi-host: start one process per host with ``--config.distributed.coordinator_address=HOST:PORT
--config.distributed.num_processes=N --config.distributed.process_id=I`` (or the environment
variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID); ``jax.distributed`` is
initialised before anything else touches JAX, and the mesh (``config.mesh``) spans all hosts.
"""

import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, results.")
_RERUN = flags.DEFINE_bool("rerun", False, "Rerun the stages that the config's changes since "
                           "the workdir's config.json affect (their old outputs are moved to "
                           "WORKDIR/replaced/).")
_FALLBACK = flags.DEFINE_bool(
    "fallback_checkpoint", False, "Set aside (rename to *.corrupt) a checkpoint or final folder "
    "that fails its checksum or cannot be read, and continue from the previous checkpoint.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  # Imported here so `--help` and flag errors answer before JAX starts.
  from posttrain_jax.io import CheckpointError
  from posttrain_jax.train import ConfigError, TrainingError, run
  from posttrain_jax.parallel import host
  host.freeze_imports()  # tracing's garbage collections skip the imported modules
  try:
    config = _CONFIG.value
    if config is not None:
      config.keys()  # forces the deferred load error, if any
  except OSError as e:  # config_flags defers a missing or broken file to first access
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    _fail(f"cannot load the config file: {lines[-1]}")
  if config is None:
    _fail("no --config given; pass --config=experiments/quickstart.py")
  try:
    from posttrain_jax.train import context
    context.apply_cpu_devices(config)  # both before anything else touches JAX
    init_distributed(config)
    install_executables(config, _WORKDIR.value)
    run(config, _WORKDIR.value, rerun=_RERUN.value, fallback_checkpoint=_FALLBACK.value)
  except CheckpointError as e:
    _fail(f"{e}: {fallback_command()}" if e.fallback and not _FALLBACK.value else str(e))
  except (ConfigError, TrainingError) as e:
    _fail(str(e))


def fallback_command() -> str:
  """This run's command line with ``--fallback_checkpoint`` added."""
  import shlex
  return shlex.join([sys.executable.rsplit("/", 1)[-1], "-m", "posttrain_jax.main",
                     *sys.argv[1:], "--fallback_checkpoint"])


def init_distributed(config) -> bool:
  """``jax.distributed.initialize`` from ``config.distributed`` (or the JAX environment
  variables); must run before any other JAX use. Returns whether the run is multi-process."""
  from posttrain_jax import parallel
  from posttrain_jax.train import ConfigError
  dist = config.get("distributed", None) or {}
  try:
    return parallel.initialize(dist.get("coordinator_address", ""),
                               dist.get("num_processes", 0), dist.get("process_id", -1),
                               timeout=dist.get("initialization_timeout", 300),
                               auto_detect=dist.get("auto_detect", False))
  except ValueError as e:
    raise ConfigError(f"config.distributed: {e}") from None


def install_executables(config, workdir: str | None) -> None:
  """Installs the run's store of whole compiled programs (parallel/executables.py;
  ``config.executable_cache``), so that a rerun of the same config and code loads them instead
  of tracing, lowering and compiling. Without a workdir nothing is installed (the run then
  stops with the workdir error)."""
  if not workdir:
    return
  from posttrain_jax import parallel
  from posttrain_jax.train import context
  parallel.executables.install(context.executable_store(config, workdir))


def _parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with a bad ``--config.KEY=VALUE`` reported as one line, not a traceback."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    lines = [l for l in str(e).splitlines() if l.strip()]
    if any(l.startswith("Traceback") for l in lines):  # config file raised: keep its message
      lines = [lines[0].rstrip(":"), lines[-1]]
    _fail(" ".join(lines))
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    overrides = [a for a in argv[1:] if a.startswith("--config.")]
    _fail(f"bad config override {' '.join(overrides) or ''} ({type(e).__name__}: {e}); every "
          "--config.KEY=VALUE must name an existing key of the config file, with a value of "
          "its type")
  return []


def _fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
