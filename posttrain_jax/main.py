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
_DRY_RUN = flags.DEFINE_bool(
  "dry_run",
  False,
  "Validate the config, build the run's context in a temporary folder (the workdir is not "
  "touched), print the memory estimate and whether it fits, and exit.",
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
  import ml_collections

  if config is not None and not isinstance(config, ml_collections.ConfigDict):
    _fail(config_file_problem(*_config_spec(sys.argv)) or "the config file gave no ConfigDict")
  if config is None:
    spec = _config_spec(sys.argv)
    if spec is not None:  # the file gave None (or something config_flags let through)
      _fail(config_file_problem(*spec) or f"the config file {spec[0]} gave no config")
    _fail("no --config given; pass --config=experiments/quickstart.py")
  try:
    from posttrain_jax.train import context

    context.apply_cpu_devices(config, threads=False)  # before anything else touches JAX
    init_distributed(config)
    context.apply_cpu_threads(config)  # starts the backend: after the processes connect
    if _DRY_RUN.value:
      dry_run(config)
      return
    install_executables(config, _WORKDIR.value)
    run(config, _WORKDIR.value, rerun=_RERUN.value, fallback_checkpoint=_FALLBACK.value)
  except Exception as e:  # pylint: disable=broad-except
    message = user_message(e, _WORKDIR.value)
    if message is None:
      raise  # a bug: the traceback is the report
    _fail(message)


def dry_run(config) -> None:
  """``--dry_run``: the config validated, the context built in a temporary folder, the memory
  estimate printed; a run that cannot fit ends as it would (one line, exit 2)."""
  import tempfile

  from posttrain_jax import methods
  from posttrain_jax.train import memory

  methods.validate(config)
  with tempfile.TemporaryDirectory() as tmp:
    ctx = methods.make_context(config, tmp, check_memory=False)
  print(memory.table(ctx.memory), flush=True)
  free, where = memory.available_bytes()
  memory.check(ctx.memory, (free, where))
  print(f"fits: {where} has {free / 2**30:.3g} GiB available", flush=True)


def library_errors() -> tuple[type[Exception], ...]:
  """The library's own error types: each message names the problem and the fix."""
  from posttrain_jax.envs import DatasetError
  from posttrain_jax.io import CheckpointError, DamagedFileError
  from posttrain_jax.models.hf_config import HFError
  from posttrain_jax.train import ConfigError, TrainingError

  return (ConfigError, CheckpointError, TrainingError, DatasetError, HFError, DamagedFileError)


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
  logging.set_verbosity(logging.ERROR)  # config_flags warns of a None config: main says it
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    spec = _config_spec(argv)
    message = (
      (config_file_problem(*spec) if spec else None)
      or _config_file_error(e, _config_path(argv))
      or _flag_error(e, argv)
    )
    if message is None:
      raise
    _fail(message)
  return []


def _config_spec(argv: list[str]) -> tuple[str, str | None] | None:
  """(absolute path, ARG or None) of ``--config=PATH[:ARG]`` (or ``--config PATH[:ARG]``)."""
  for i, arg in enumerate(argv):
    value = (
      arg.split("=", 1)[1]
      if arg.startswith("--config=")
      else argv[i + 1]
      if arg == "--config" and i + 1 < len(argv)
      else None
    )
    if value:
      path, _, rest = value.partition(":")
      return os.path.abspath(path), (rest if ":" in value else None)
  return None


def _config_path(argv: list[str]) -> str | None:
  """The config file named by ``--config=PATH[:ARG]``, absolute."""
  spec = _config_spec(argv)
  return None if spec is None else spec[0]


CONFIG_HINT = "see experiments/quickstart.py"


def config_file_problem(path: str, arg: str | None = None) -> str | None:
  """Why the config file ``path`` gives no config, as one line, or None when it gives an
  ``ml_collections.ConfigDict``: unreadable, NUL bytes or not UTF-8 (not a Python file), a
  syntax error, no ``get_config``, ``get_config`` raising, or returning anything but a
  ConfigDict. Runs the file's ``get_config`` (as ``config_flags`` does: with ``ARG`` when the
  flag has one); called only when loading it failed or gave None."""
  import ast
  import importlib.util

  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    return f"cannot read the config file {path}: {e.strerror}; pass an existing .py file"
  if b"\x00" in data:
    return (
      f"the config file {path} contains NUL bytes: it is not Python source; pass a .py file "
      f"that defines get_config() ({CONFIG_HINT})"
    )
  try:
    source = data.decode("utf-8")
  except UnicodeDecodeError as e:
    return f"the config file {path} is not UTF-8 text (byte {e.start}); save it as UTF-8"
  try:
    tree = ast.parse(source, path)
  except SyntaxError as e:
    return (
      f"the config file {path} has a syntax error at line {e.lineno}: {e.msg}; fix it and rerun"
    )
  names = {
    n.name if isinstance(n, ast.FunctionDef) else getattr(t, "id", None)
    for n in tree.body
    if isinstance(n, (ast.FunctionDef, ast.Assign, ast.ImportFrom))
    for t in (getattr(n, "targets", None) or [n])
  } | {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
  if "get_config" not in names:
    return (
      f"the config file {path} defines no get_config(); it must define get_config() returning "
      f"an ml_collections.ConfigDict ({CONFIG_HINT})"
    )
  spec = importlib.util.spec_from_file_location("_posttrain_jax_config_check", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    config = module.get_config(arg) if arg is not None else module.get_config()
  except Exception as e:  # pylint: disable=broad-except
    return _config_file_error(e, path) or f"the config file {path} raised {type(e).__name__}: {e}"
  import ml_collections

  if not isinstance(config, ml_collections.ConfigDict):
    return (
      f"get_config() in {path} returned {type(config).__name__}, not an "
      f"ml_collections.ConfigDict; return ml_collections.ConfigDict(...) ({CONFIG_HINT})"
    )
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
