"""What every stage of an experiment shares: env, tokenizer, model graph, mesh, held-out problems."""

import dataclasses
import json
import os
import shutil
import sys

import jax
import ml_collections
import numpy as np
from flax import nnx

from posttrain_jax import envs, models, parallel, rewards, rollout, streams
from posttrain_jax import io as ptio
from posttrain_jax.envs import contexts as contexts_lib
from posttrain_jax.parallel import compile_cache
from posttrain_jax.registry import ConfigError, TrainingError  # noqa: F401 (re-exported)
from posttrain_jax.train import evaluate, memory, samplers
from posttrain_jax.train import placement as placement_lib
from posttrain_jax.train import prompts as prompts_lib
from posttrain_jax.train import state as state_lib

# Stream ids folded into the run key so stages draw independent numbers.


def skipped_message(stage: str, cfg, steps: int, at: int, nonfinite: float) -> str:
  """The stop message after ``steps`` steps in a row whose every update of stage ``stage``
  (config section ``cfg``) was skipped, the last one at step ``at``; ``nonfinite``: that step's
  count of updates skipped for a non-finite value (else they were exploding)."""
  why = (
    "non-finite (NaN or inf in the loss, gradients, update or new parameters)"
    if nonfinite
    else f"exploding (larger than config.{stage}.max_update_ratio="
    f"{cfg.max_update_ratio:g} x the parameters' norm)"
  )
  return (
    f"{stage}: every update was skipped as {why} for {steps} steps in a row (last at step "
    f"{at}); the learning rate is likely too high: lower config.{stage}.lr (now "
    f"{cfg.lr:g}) or clip gradients harder with config.{stage}.grad_clip (now "
    f"{cfg.grad_clip:g}) and pass --rerun to restart the stage in this workdir; no "
    "checkpoint holds a skipped update"
  )


@dataclasses.dataclass
class Context:
  """Shared state of one experiment run (host side).

  ``placement`` holds the run's mesh (built once from ``config.mesh``); ``init_params`` lie
  placed with the trainer role's rules.
  """

  config: ml_collections.ConfigDict
  workdir: str
  env: object
  tokenizer: object
  graphdef: object
  init_params: nnx.State
  prompt_len: int
  eval_problems: list
  key: jax.Array
  show_progress: bool = True
  placement: placement_lib.Placement | None = None
  chat_template: bool = False
  dataset: object = None  # envs.StaticDataset of config.env.dataset, or None
  heldout_env: object = None  # config.eval.heldout_env, or None
  heldout_problems: list = dataclasses.field(default_factory=list)
  extra_envs: dict = dataclasses.field(default_factory=dict)  # name -> (env, problems)
  sampler_mesh: jax.sharding.Mesh | None = None  # config.sampler_mesh; None: the run's mesh
  scorer: rewards.Scorer | None = None  # the run's reward calls (config.reward)
  # The run's reward terms (config.reward.terms, rewards/terms.py); None: the verifier alone.
  reward_terms: object = None
  fallback_checkpoint: bool = False  # set aside a corrupt checkpoint, restore the previous
  # The METHODS table the engine was handed (train/hooks.py); the active ones act in the step.
  methods: tuple = ()
  memory: dict = dataclasses.field(default_factory=dict)  # train/memory.py's estimate

  def prompt_texts(self, problems) -> list[str]:
    """What the model is prompted with for each problem (see :func:`prompt_text`)."""
    return [prompt_text(self.tokenizer, p.prompt, self.chat_template) for p in problems]

  @property
  def mesh(self) -> jax.sharding.Mesh | None:
    return None if self.placement is None else self.placement.mesh

  @property
  def rollout_mesh(self) -> jax.sharding.Mesh | None:
    """The mesh the samplers run on: ``config.sampler_mesh`` if set, else the run's mesh."""
    return self.mesh if self.sampler_mesh is None else self.sampler_mesh

  @property
  def is_primary(self) -> bool:
    """Whether this process writes metrics, progress and summaries (process 0)."""
    return parallel.is_primary()

  def stage_dir(self, stage: str) -> str:
    path = os.path.join(self.workdir, stage)
    os.makedirs(path, exist_ok=True)
    return path

  def sampler_config(
    self, *, temperature: float, max_new_tokens: int, top_k: int = 0, top_p: float = 1.0
  ) -> rollout.SamplerConfig:
    return rollout.SamplerConfig(
      max_new_tokens=max_new_tokens,
      eos_id=self.tokenizer.eos_token_id,
      pad_id=self.tokenizer.pad_token_id,
      temperature=temperature,
      top_k=top_k,
      top_p=top_p,
    )

  def make_evaluator(
    self,
    num_problems: int | None = None,
    *,
    pass_n: int | None = None,
    heldout: bool = False,
    extra: str = "",
  ):
    """The evaluator of the env's held-out problems (``heldout``: of ``config.eval.heldout_env``
    instead, whose metrics are named ``eval/heldout_*``; ``extra``: of that env of
    ``config.eval.extra_envs``, greedy only, metrics ``eval/extra_*``)."""
    ev = self.config.eval
    max_new = self.config.rl.max_new_tokens
    if extra:
      task, source = self.extra_envs[extra]
      pass_n = 0
    else:
      source = self.heldout_problems if heldout else self.eval_problems
      task = self.heldout_env if heldout else self.env
    problems = source[:num_problems] if num_problems else source
    greedy = samplers.make_sampler(
      self, self.sampler_config(temperature=0.0, max_new_tokens=max_new), task=task
    )
    sampled = samplers.make_sampler(
      self, self.sampler_config(temperature=ev.temperature, max_new_tokens=max_new), task=task
    )
    return evaluate.Evaluator(
      problems=problems,
      env=task,
      tokenizer=self.tokenizer,
      greedy=greedy,
      prefix="eval/extra_" if extra else "eval/heldout_" if heldout else "eval/",
      sampled=sampled,
      prompt_len=self.prompt_len,
      prompt_texts=self.prompt_texts,
      batch_size=min(ev.batch_size, max(len(problems), 1)),
      pass_k=ev.pass_k,
      pass_n=ev.pass_n if pass_n is None else pass_n,
      pass_problems=min(ev.pass_problems, len(problems)),
      cast=rollout.make_inference_cast(ev.precision),
      scorer=self.scorer,
      env_label=extra or (self.config.eval.heldout_env if heldout else self.config.env.name),
    )

  @property
  def eval_key(self) -> jax.Array:
    return jax.random.key(self.config.eval.seed)

  # -- final parameters of a finished stage ---------------------------------------------------
  def save_final(self, stage: str, params, summary: dict) -> None:
    """Writes the stage's final parameters, then ``done.json``. A ``final`` folder already
    there (a run stopped between the two) is replaced: the stage just finished again from
    the same checkpoint, so it holds the same parameters."""
    self.save_params(stage, "final", params)
    if self.is_primary:
      write_json(os.path.join(self.stage_dir(stage), "done.json"), summary)
    parallel.barrier(f"done:{stage}")

  def save_params(self, stage: str, name: str, params) -> str:
    """Writes ``params`` to ``WORKDIR/<stage>/<name>`` (a folder there is replaced: the stage
    finished again from the same checkpoint); returns the folder."""
    path = os.path.join(self.stage_dir(stage), name)
    if self.is_primary and os.path.isdir(path):
      shutil.rmtree(path)
    parallel.barrier(f"{name}_clear:{stage}")
    ckpt = ptio.Checkpointer(path, max_to_keep=1)
    ckpt.save(0, params, {"stage": stage, "name": name})
    ckpt.close()
    return path

  def load_params(self, stage: str, name: str, target):
    """Parameters :meth:`save_params` wrote, shaped and placed like ``target``; None when the
    stage has no such folder. CheckpointError when they cannot be read."""
    path = os.path.join(self.stage_dir(stage), name)
    if not os.path.isdir(path):
      return None
    ckpt = ptio.Checkpointer(path, max_to_keep=1)
    try:
      return ckpt.restore(target)[0]
    finally:
      ckpt.close()

  def load_final(self, stage: str):
    """The final parameters of a finished ``stage``. When they fail their checksum or cannot be
    read: with ``fallback_checkpoint`` the ``final`` folder and ``done.json`` are set aside
    (renamed ``*.corrupt``) and None is returned (the stage then finishes again from its
    checkpoints); without, CheckpointError says to rerun with the flag."""
    path = os.path.join(self.stage_dir(stage), "final")
    ckpt = ptio.Checkpointer(path, max_to_keep=1)
    try:
      params, _ = ckpt.restore(self.init_params)
    except ptio.CheckpointError as e:
      if not e.fallback:
        raise
      bad = e
    else:
      return params
    finally:
      ckpt.close()
    if not self.fallback_checkpoint:
      raise ptio.CheckpointError(
        f"the final parameters of stage {stage} in {path} are bad: {bad.problem}; rerun the "
        f"same command with {ptio.checkpoint.FALLBACK_FLAG} to set them aside (renamed to "
        f"final{ptio.checkpoint.CORRUPT_SUFFIX}, nothing is deleted) and finish the stage "
        "again from its checkpoints",
        fallback=True,
        problem=bad.problem,
      ) from bad
    if self.is_primary:
      ptio.checkpoint.set_aside(path)
      ptio.checkpoint.set_aside(os.path.join(self.stage_dir(stage), "done.json"))
    parallel.barrier(f"final_aside:{stage}")
    return None

  def is_done(self, stage: str) -> bool:
    return os.path.exists(os.path.join(self.workdir, stage, "done.json"))

  def done_summary(self, stage: str) -> dict:
    with open(os.path.join(self.workdir, stage, "done.json"), encoding="utf-8") as f:
      return json.load(f)


def write_json(path: str, obj) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def run_charset(config, extra_chars: str = "") -> str:
  """The char tokenizer's characters for a new run: the env's set (envs.tokenizer_charset),
  widened to every task's characters, then to the union, when the dataset or the held-out env
  need more."""
  charset = envs.tokenizer_charset(config.env.name)
  need = set(extra_chars)
  if need <= set(charset):
    return charset
  if need <= set(envs.CHARSET):
    return envs.CHARSET
  return "".join(sorted(set(envs.CHARSET) | need))


def _load_tokenizer(config, workdir: str, extra_chars: str = ""):
  """The Hugging Face folder's tokenizer (``config.model.hf_path``; padding with EOS when it has
  no pad token), else the env's char tokenizer, built once into WORKDIR/tokenizer."""
  hf_path = config.model.hf_path
  if hf_path:
    tokenizer = models.load_hf_tokenizer(hf_path)
    if tokenizer.eos_token_id is None:
      raise models.hf.HFError(
        f"the tokenizer of {hf_path} has no EOS token; generation could "
        "not stop (set eos_token in its tokenizer_config.json)"
      )
    models.hf.check_tokenizer_fits(models.hf.load_config(hf_path), tokenizer, hf_path)
    if tokenizer.pad_token_id is None:
      tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
  tok_dir = os.path.join(workdir, "tokenizer")
  tokenizer = None
  if parallel.is_primary():
    if os.path.isdir(tok_dir):
      try:
        tokenizer = models.load_tokenizer(tok_dir)
      except models.DamagedTokenizerError as e:  # a kill while an older version wrote it
        print(
          f"warning: {e.reason}; rebuilt it from the config (the tasks' character tokenizer "
          "is a function of the config)",
          file=sys.stderr,
          flush=True,
        )
    if tokenizer is None:
      built = models.build_char_tokenizer(run_charset(config, extra_chars))
      models.save_tokenizer(built, tok_dir)
  parallel.barrier("tokenizer")
  return tokenizer if tokenizer is not None else models.load_tokenizer(tok_dir)


def prompt_text(tokenizer, prompt: str, chat_template: bool) -> str:
  """The text the model sees for an env prompt: as is, or wrapped as one user turn by the
  tokenizer's chat template (with the generation prompt appended)."""
  if not chat_template:
    return prompt
  return tokenizer.apply_chat_template(
    [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
  )


def _prompt_ids(tokenizer, prompt: str, chat_template: bool) -> list:
  return tokenizer(prompt_text(tokenizer, prompt, chat_template), add_special_tokens=False)[
    "input_ids"
  ]


def _leading_margin(tokenizer, chars: str) -> int:
  """Tokens a one-character text takes beyond one (e.g. SentencePiece's "▁" prefix): the
  margin a pretrained tokenizer's prompts need over one token per character. 0 for character
  and byte-level BPE tokenizers."""
  return max(
    [0] + [len(tokenizer(c, add_special_tokens=False)["input_ids"]) - 1 for c in set(chars)]
  )


def check_sequence_length(config, prompt_len: int, prompt_chars: int, limit: int) -> None:
  """ConfigError when the padded prompt plus ``config.rl.max_new_tokens`` exceeds the model's
  ``max_seq_len`` (its position tables and KV cache), naming the numbers and the fix."""
  total = prompt_len + config.rl.max_new_tokens
  if total <= limit:
    return
  source = f"config.env.dataset={config.env.dataset!r}" if config.env.dataset else "the env"
  fix = (
    "use a checkpoint with more positions"
    if config.model.hf_path
    else f"set config.model.max_seq_len >= {total}"
  )
  raise ConfigError(
    f"sequences need {total} positions, over the model's max_seq_len={limit}: "
    f"the longest prompt ({prompt_chars} characters, from {source} or the "
    f"held-out env) pads to {prompt_len} tokens, plus "
    f"config.rl.max_new_tokens={config.rl.max_new_tokens}; shorten the "
    f"prompts, lower max_new_tokens or {fix}"
  )


def apply_cpu_devices(config, threads: bool = True) -> None:
  """``config.cpu_devices`` (XLA:CPU devices the host is split into; 0: JAX's setting) and,
  with ``threads``, ``config.cpu_threads`` (:func:`apply_cpu_threads`), applied before JAX
  starts its backend (entry points call this first). ConfigError once too late for the
  devices."""
  try:
    parallel.set_cpu_devices(config.cpu_devices)
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None
  if threads:
    apply_cpu_threads(config)


def apply_cpu_threads(config) -> None:
  """``config.cpu_threads``: XLA:CPU's compute threads (parallel/host.py). It starts JAX's
  backend, so a multi-process run calls it after ``jax.distributed.initialize``; once JAX has
  started, the pool is left as it is (the environment record says so)."""
  parallel.set_cpu_threads(config.get("cpu_threads", 0))


def _eval_level(config, env) -> int:
  """The level a held-out or extra env is scored at: ``eval.heldout_level`` (0: ``env.level``)
  clipped to the env's levels."""
  level = config.eval.heldout_level or config.env.level
  return min(max(level, env.levels[0]), env.levels[-1])


def eval_sets(config) -> dict:
  """The problems the eval stage scores, ``{name: (env, problems)}``: ``train`` (the run's env
  at ``env.level``), ``heldout`` (``eval.heldout_env``, when set) and each of
  ``eval.extra_envs`` by name; all from the eval split, seeded by ``eval.seed``. Built without a
  model, so a script can score a heuristic on exactly the problems a run was scored on."""
  ev = config.eval
  env = envs.get_env(config.env.name)
  sets = {
    "train": (
      env,
      env.sample(jax.random.key(ev.seed), ev.num_problems, level=config.env.level, split="eval"),
    )
  }
  named = ([("heldout", ev.heldout_env, 1)] if ev.heldout_env else []) + [
    (name, name, 2 + i) for i, name in enumerate(ev.extra_envs)
  ]
  for name, env_name, offset in named:
    e = envs.get_env(env_name)
    sets[name] = (
      e,
      e.sample(
        jax.random.key(ev.seed + offset),
        ev.num_problems,
        level=_eval_level(config, e),
        split="eval",
      ),
    )
  return sets


def _env_side(config) -> dict:
  """What ``config``'s envs give a Context (env, eval problems, dataset, held-out and extra
  envs), with the characters its tokenizer needs beyond the env's (``chars``) and the longest
  prompt of each source (``prompt_chars``)."""
  sets = eval_sets(config)
  env = sets["train"][0]
  dataset = prompts_lib.load_dataset(config)
  heldout_env, heldout_problems = sets.get("heldout", (None, []))
  extra_envs = {name: sets[name] for name in config.eval.extra_envs}
  chars = (
    (dataset.chars if dataset is not None else "")
    + (heldout_env.chars if heldout_env is not None else "")
    + "".join(e.chars for e, _ in extra_envs.values())
  )
  if config.rl.teacher.context != "none":  # the teacher's privileged context (envs.contexts)
    chars += contexts_lib.CHARS
  prompt_chars = [env.max_prompt_chars(lv) for lv in (config.env.level, *config.pretrain.levels)]
  if dataset is not None:
    prompt_chars.append(dataset.max_prompt_chars())
  for name, (e, _) in sets.items():
    if name != "train":
      prompt_chars.append(e.max_prompt_chars(_eval_level(config, e)))
  fields = dict(
    env=env,
    eval_problems=sets["train"][1],
    dataset=dataset,
    heldout_env=heldout_env,
    heldout_problems=heldout_problems,
    extra_envs=extra_envs,
  )
  return dict(fields=fields, chars=chars, prompt_chars=prompt_chars)


def _reward_fields(config, workdir: str, tokenizer) -> dict:
  return dict(
    scorer=rewards.Scorer(
      timeout=config.reward.timeout,
      workers=config.reward.workers,
      max_error_rate=config.reward.max_error_rate,
    ),
    reward_terms=reward_terms(config, workdir, tokenizer),
  )


def _check_vocabulary(tokenizer, chars: str, workdir: str) -> None:
  """ConfigError when the workdir's char tokenizer (made by an earlier run) lacks characters a
  stage of this run needs (e.g. a stage on another env was added after pretraining)."""
  vocab = tokenizer.get_vocab()
  missing = sorted(c for c in set(chars) if c not in vocab)
  if missing:
    raise ConfigError(
      f"the tokenizer in {os.path.join(workdir, 'tokenizer')} (made by an earlier run) lacks "
      f"characters {''.join(missing)!r} that a stage of this config needs (its env, dataset, "
      "held-out or extra envs); run this config in another --workdir"
    )


def make_context(
  config, workdir: str, *, methods: tuple, stage_configs=(), check_memory: bool = True
) -> Context:
  """Builds the mesh, env, tokenizer (saved to and loaded from WORKDIR/tokenizer), model (placed
  on the mesh) and eval set. ``methods``: the METHODS table (``posttrain_jax.methods``) whose
  active entries act in the run (the engine names none itself). ``stage_configs``: the
  effective configs of the run's stages (train/stages.py); the tokenizer covers every one's
  characters and the prompt length fits every one's prompts. The run's memory estimate
  (train/memory.py) is kept as ``memory`` and, with ``check_memory``, a run that cannot fit is
  refused here, before any stage."""
  apply_cpu_devices(config)
  placement = placement_lib.Placement(placement_lib.mesh_from_config(config.get("mesh")))
  sampler_mesh = placement_lib.sampler_mesh_from_config(config)
  others = [c for c in stage_configs if c is not config]
  side = _env_side(config)
  sides = [side] + [_env_side(c) for c in others]
  env = side["fields"]["env"]
  extra = side["chars"] + "".join(
    envs.tokenizer_charset(c.env.name) + s["chars"] for c, s in zip(others, sides[1:])
  )
  tokenizer = _load_tokenizer(config, workdir, extra)
  if not config.model.hf_path:
    _check_vocabulary(tokenizer, env.chars + extra, workdir)
  key = jax.random.key(config.seed)
  seed = int(jax.random.randint(jax.random.fold_in(key, streams.tag("init")), (), 0, 2**31 - 1))
  graphdef, params = state_lib.load_model(config.model, len(tokenizer), seed, placement.mesh)
  params = placement.place(params)
  chat = bool(config.model.chat_template)
  overhead = len(_prompt_ids(tokenizer, "", chat))
  if config.model.hf_path:
    overhead += _leading_margin(tokenizer, env.chars + extra)
  prompt_chars = [n for s in sides for n in s["prompt_chars"]]
  prompt_len = rollout.bucket_length(max(prompt_chars) + overhead)
  check_sequence_length(
    config,
    prompt_len,
    max(prompt_chars),
    state_lib.model_config(config.model, len(tokenizer)).max_seq_len,
  )
  num_params = sum(x.size for x in jax.tree.leaves(params))
  mc = state_lib.model_config(config.model, len(tokenizer))
  estimate = memory.estimate(config, mc, num_params, prompt_len)
  if check_memory:
    memory.check(estimate, memory.available_bytes())
  return Context(
    memory=estimate,
    config=config,
    workdir=workdir,
    tokenizer=tokenizer,
    graphdef=graphdef,
    init_params=params,
    prompt_len=prompt_len,
    key=key,
    show_progress=config.progress and parallel.is_primary(),
    placement=placement,
    chat_template=chat,
    sampler_mesh=sampler_mesh,
    methods=tuple(methods),
    **side["fields"],
    **_reward_fields(config, workdir, tokenizer),
  )


def for_stage(ctx: Context, config) -> Context:
  """``ctx`` for a stage whose config is ``config`` (the run's with the stage's overrides): its
  envs, eval problems, reward calls and random key (``config.seed``); the tokenizer, model,
  mesh and prompt length stay the run's. ``ctx`` itself when ``config`` is the run's."""
  if config is ctx.config:
    return ctx
  return dataclasses.replace(
    ctx,
    config=config,
    key=jax.random.key(config.seed),
    show_progress=config.progress and parallel.is_primary(),
    **_env_side(config)["fields"],
    **_reward_fields(config, ctx.workdir, ctx.tokenizer),
  )


def reward_terms(config, workdir: str, tokenizer):
  """The run's :class:`~posttrain_jax.rewards.terms.RewardSet`, or None when
  ``config.reward.terms`` leaves the env's verifier alone at weight 1."""
  terms = rewards.RewardSet.from_config(
    config.reward.terms, rewards.RunInfo(workdir=workdir, tokenizer=tokenizer)
  )
  return None if terms.is_plain else terms


def executable_store(config, workdir: str) -> parallel.executables.ExecutableCache | None:
  """The store of whole compiled programs for a run of ``config`` in ``workdir``, for an entry
  point to install (``parallel.executables.install``) before it builds the run; None when
  ``config.executable_cache``, the environment, the test session or several processes turn
  it off. It lies next to the JAX compilation cache the run will use; its key covers the
  config, the checkpoint (``model.hf_path``) or WORKDIR/tokenizer folder and the loaded source,
  read when the first program is keyed (after :func:`make_context` wrote the tokenizer)."""
  hf_path = config.model.hf_path
  cache_dir = jax.config.jax_compilation_cache_dir or compile_cache.resolve_dir(
    config.get("compilation_cache_dir", None)
  )
  return parallel.executables.for_run(
    config.to_json_best_effort(sort_keys=True),
    [hf_path or os.path.join(workdir, "tokenizer")],
    configured=bool(config.get("executable_cache", True)),
    cache_dir=cache_dir,
  )


@dataclasses.dataclass
class Resumed:
  """A supervised stage's start: its train state (fresh or from the last checkpoint), the
  optimiser, the checkpointer and metric writer of ``out_dir``, and where it resumes."""

  state: state_lib.TrainState
  tx: object
  ckpt: object
  writer: object
  start: int = 0
  elapsed: float = 0.0
  skipped: int = 0


def resume_stage(ctx, out_dir: str, params, cfg) -> Resumed:
  """The setup a supervised stage (pretraining, the reward model) shares: an optimiser from
  ``cfg``, a train state on ``params``, restored from ``out_dir/checkpoints`` when one exists,
  and the metric writer resumed to that step."""
  tx = state_lib.make_optimizer(**state_lib.optimizer_kwargs(cfg))
  state = ctx.placement.init_state(params, tx)
  ckpt = ptio.Checkpointer(os.path.join(out_dir, "checkpoints"), max_to_keep=2, async_save=True)
  writer = ptio.MetricWriter(out_dir, tensorboard=ctx.config.tensorboard, enabled=ctx.is_primary)
  out = Resumed(state, tx, ckpt, writer)
  restored = ckpt.restore_latest(state, fallback=ctx.fallback_checkpoint)
  if restored is not None:
    out.state, meta = restored
    out.start, out.elapsed = meta["step"], meta.get("elapsed", 0.0)
    out.skipped = meta.get("skipped", 0)
  writer.resume(out.start)  # the record up to the checkpoint; nothing without one
  return out


def as_floats(metrics: dict) -> dict:
  """Device scalars to Python floats (one host sync)."""
  host = jax.device_get(metrics)
  return {k: float(np.asarray(v)) for k, v in host.items()}
