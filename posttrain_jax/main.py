"""Entry point: ``python -m posttrain_jax.main --config=experiments/NAME.py[:ARG] --workdir=DIR``.

Fields of the config are overridden on the command line, e.g. ``--config.rl.lr=3e-4``.
Every bad input prints one line ``error: ...`` naming the problem and the fix, and exits with
status 2: a config file that cannot load, a bad override, and every error of the library's own
types (config, checkpoint, training, dataset, Hugging Face folder); a full disk anywhere says
``no space left on DEVICE (PATH); free space and rerun the same command``.

Multi-host: start one process per host with ``--config.distributed.coordinator_address=HOST:PORT
--config.distributed.num_processes=N --config.distributed.process_id=I`` (or the environment
variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID); ``jax.distributed`` is
initialised before anything else touches JAX, and the mesh (``config.mesh``) spans all hosts.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Experiment config file.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, results.")
_RERUN = flags.DEFINE_bool(
  "rerun",
  False,
  "Rerun the stages that the config's changes since "
  "the workdir's config.json affect (their old outputs are moved to "
  "WORKDIR/replaced/).",
)
_FALLBACK = flags.DEFINE_bool(
  "fallback_checkpoint",
  False,
  "Set aside (rename to *.corrupt) a checkpoint or final folder "
  "that fails its checksum or cannot be read, and continue from the previous checkpoint.",
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  # Imported here so `--help` and flag errors answer before JAX starts.
  from posttrain_jax.io import disk_full
  from posttrain_jax.methods import run  # the engine, handed the METHODS table

  logging.get_absl_handler().addFilter(disk_full.QuietFullDisk())  # main reports it once
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
  except Exception as e:  # pylint: disable=broad-except
    message = user_message(e, _WORKDIR.value)
    if message is None:
      raise  # a bug: the traceback is the report
    _fail(message)


def library_errors() -> tuple[type[Exception], ...]:
  """The library's own error types: each message names the problem and the fix."""
  from posttrain_jax.envs import DatasetError
  from posttrain_jax.io import CheckpointError
  from posttrain_jax.models.hf_config import HFError
  from posttrain_jax.train import ConfigError, TrainingError

  return (ConfigError, CheckpointError, TrainingError, DatasetError, HFError)


def user_message(error: BaseException, workdir: str | None) -> str | None:
  """The one line for ``error``: a full disk or a library error anywhere in its chain of
  causes; None for anything else (a bug, whose traceback is the report)."""
  from posttrain_jax.io import disk_full

  path = disk_full.full_disk_path(error, workdir or os.getcwd())
  if path is not None:
    return disk_full.message(path)
  seen = set()
  while error is not None and id(error) not in seen:  # e.g. wrapped by a worker thread's error
    if isinstance(error, library_errors()):
      from posttrain_jax.io import CheckpointError

      if isinstance(error, CheckpointError) and error.fallback and not _FALLBACK.value:
        return f"{error}: {fallback_command()}"
      return str(error)
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return None


def fallback_command() -> str:
  """This run's command line with ``--fallback_checkpoint`` added."""
  import shlex

  return shlex.join(
    [
      sys.executable.rsplit("/", 1)[-1],
      "-m",
      "posttrain_jax.main",
      *sys.argv[1:],
      "--fallback_checkpoint",
    ]
  )


def init_distributed(config) -> bool:
  """``jax.distributed.initialize`` from ``config.distributed`` (or the JAX environment
  variables); must run before any other JAX use. Returns whether the run is multi-process."""
  from posttrain_jax import parallel
  from posttrain_jax.train import ConfigError

  dist = config.get("distributed", None) or {}
  try:
    return parallel.initialize(
      dist.get("coordinator_address", ""),
      dist.get("num_processes", 0),
      dist.get("process_id", -1),
      timeout=dist.get("initialization_timeout", 300),
      auto_detect=dist.get("auto_detect", False),
    )
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
  """absl flag parsing, with a config file that cannot load and a bad ``--config.KEY=VALUE``
  each reported as one line, not a traceback."""
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    message = _config_file_error(e, _config_path(argv)) or _flag_error(e, argv)
    if message is None:
      raise
    _fail(message)
  return []


def _config_path(argv: list[str]) -> str | None:
  """The config file named by ``--config=PATH[:ARG]`` (or ``--config PATH``), absolute."""
  for i, arg in enumerate(argv):
    value = (
      arg.split("=", 1)[1]
      if arg.startswith("--config=")
      else argv[i + 1]
      if arg == "--config" and i + 1 < len(argv)
      else None
    )
    if value:
      return os.path.abspath(value.split(":", 1)[0])
  return None


def _config_file_error(error: BaseException, path: str | None) -> str | None:
  """One line for an error raised by the config file itself (a syntax error, or its
  ``get_config`` raising), found by the file's frame in the traceback; else None."""
  if path is None:
    return None
  if isinstance(error, SyntaxError) and os.path.abspath(error.filename or "") == path:
    return (
      f"the config file {path} has a syntax error at line {error.lineno}: {error.msg}; "
      "fix it and rerun"
    )
  tb = error.__traceback__
  while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != path:
    tb = tb.tb_next
  if tb is None:
    return None
  return f"the config file {path} raised {type(error).__name__} at line {tb.tb_lineno}: {error}"


def _flag_error(error: BaseException, argv: list[str]) -> str | None:
  """One line for a bad flag or a bad ``--config.KEY=VALUE`` override; else None."""
  if isinstance(error, flags.Error):
    lines = [l for l in str(error).splitlines() if l.strip()]
    if any(l.startswith("Traceback") for l in lines):  # config file raised: keep its message
      lines = [lines[0].rstrip(":"), lines[-1]]
    return " ".join(lines)
  if isinstance(error, (AttributeError, KeyError, TypeError, ValueError)):
    overrides = [a for a in argv[1:] if a.startswith("--config.")]
    return (
      f"bad config override {' '.join(overrides) or ''} ({type(error).__name__}: "
      f"{error}); every --config.KEY=VALUE must name an existing key of the config "
      "file, with a value of its type"
    )
  return None


def _fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
