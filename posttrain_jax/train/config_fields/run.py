"""The run's own keys and its small sections: the seed and the stages, display and caches, the
placement (meshes, processes), the env, the model and the reward calls."""

from posttrain_jax.fields import Field, Section, free  # noqa: F401

RUN = dict(
  compilation_cache_dir=Field(
    '~/.cache/posttrain_jax/xla',
    "JAX's persistent compilation cache; `''` turns it off; `$POSTTRAIN_JAX_COMPILATION_CACHE` overrides it",
    rerun=False,
  ),
  cpu_devices=Field(
    0,
    "XLA:CPU only: split the host's cores into this many JAX devices (0: JAX's default of one), so a sampler mesh over them decodes row shards concurrently",
    kind='count0',
    rerun=False,
  ),
  cpu_threads=Field(
    2,
    "XLA:CPU only: threads a computation is split over (0: one per core, JAX's default). Eigen splits a large matmul's sum between them, so the numbers depend on it: 2 gives the same numbers on every machine with at least 2 cores, 1 on every machine (a single run on 2 cores about 16% slower; docs/reproducibility.md)",
    kind='count0',
    rerun=False,
  ),
  distributed=Section(
    'multi-process runs (one process per host)',
    rerun=False,
    fields=dict(
      auto_detect=Field(False, 'let JAX read SLURM / Open MPI / TPU / Kubernetes settings'),
      coordinator_address=Field(
        '',
        "multi-process runs: the coordinator's address (empty: one process, unless `JAX_COORDINATOR_ADDRESS` is set)",
      ),
      initialization_timeout=Field(300, 'seconds to wait for the other processes', kind='positive'),
      num_processes=Field(0, 'number of processes (0: from the environment, else one)'),
      process_id=Field(-1, "this process's index (-1: from the environment)"),
    ),
  ),
  env=Section(
    'the task: an env by name and level, or a static dataset of prompts',
    fields=dict(
      dataset=Field(
        '',
        'train prompts from a static dataset (`.jsonl` file or TFDS array_record directory), in epochs; empty: fresh problems from `env.name`',
      ),
      level=Field(3, "the task's difficulty level"),
      name=Field(
        'arithmetic', 'the task, a name of `envs.ENVS`; its eval split gives the held-out problems'
      ),
    ),
  ),
  executable_cache=Field(
    True,
    "store whole compiled programs under the cache's `executables/` (a rerun skips tracing and lowering); `$POSTTRAIN_JAX_EXECUTABLE_CACHE=0` turns it off",
    rerun=False,
  ),
  mesh=Section(
    "the run's device mesh over ('data', 'fsdp', 'tensor')",
    rerun=False,
    fields=dict(
      axes=Field(('data', 'fsdp', 'tensor'), "the mesh's axis names"),
      devices=Field((), 'indices into `jax.devices()` the mesh spans; empty: all'),
      shape=Field(
        (1, -1, 1),
        "device mesh over `('data', 'fsdp', 'tensor')`; one -1 takes the remaining devices (the default shards parameters FSDP over every device)",
      ),
    ),
  ),
  model=Section(
    'the model: a preset trained from scratch, or a Hugging Face checkpoint',
    unused=(
      (
        ("model.preset", "model.max_seq_len"),
        lambda c: bool(c.model.hf_path),
        "config.model.hf_path loads the checkpoint's own architecture and positions",
      ),
    ),
    fields=dict(
      attention_impl=Field(
        'auto',
        "the full forward's attention: `reference` (the plain einsum or causal blocks), `xla` / `cudnn` (`jax.nn.dot_product_attention`), `auto`: reference on CPU, cuDNN's fused kernel on GPU where it applies",
        rerun=False,
      ),
      causal_block=Field(
        -1,
        'causal query blocks in the training forward: -1 auto (64 on CPU, else off), 0 off, or a block size',
        rerun=False,
      ),
      chat_template=Field(
        False,
        "wrap every env prompt in the Hugging Face tokenizer's chat template (needs `hf_path`)",
      ),
      dtype=Field('float32', 'parameter / activation dtype (`float32`, `bfloat16`)'),
      hf_path=Field(
        '', 'a local Hugging Face checkpoint folder instead of a preset (its tokenizer too)'
      ),
      max_seq_len=Field(
        256,
        'maximum sequence length: the padded prompt plus `rl.max_new_tokens` must fit (a run that needs more is refused with the numbers); ignored with `model.hf_path`',
        kind='count',
      ),
      overrides=free('fields of the preset to override (e.g. `num_experts`)'),
      preset=Field('tiny', 'a name of `models.PRESETS`, trained from scratch'),
      remat=Field(
        False, "rematerialise each layer's activations in the backward pass", rerun=False
      ),
      unroll_layers=Field(
        'auto',
        '`auto` (unrolled on CPU for ≤ 8 layers), `always` or `never` (scanned)',
        rerun=False,
      ),
    ),
  ),
  progress=Field(True, 'show a progress bar', rerun=False),
  reward=Section(
    'reward calls (rewards/calls.py) and the reward as a sum of named terms',
    fields=dict(
      max_error_rate=Field(
        0.5,
        "the run stops when more than this fraction of a step's reward calls (all draw rounds) or of an evaluation's calls failed (raised, timed out, NaN/inf, not a number); `1.0` never stops. Each failed call scores 0 and is counted by kind in the records: `reward/errors/<kind>` (RL steps), `eval/reward/errors/<kind>` (evaluations), counts of calls; the first of each kind in a run is printed once",
        kind='fraction',
        rerun=False,
      ),
      terms=free(
        'the reward as a weighted sum of named terms ([rewards.md](rewards.md)): name -> `{fn, weight, kwargs}`, `fn` a `REWARDS` name (`math`, `format`, `tag_count`, ...), `"module:function"` or `"path/file.py:function"` (default: the name), `weight` (default 1); the env\'s verifier is the term `correct` (weight 1 unless given, 0 drops it). Each term is logged as `reward/<name>` and its failed calls as `reward/<name>/errors`; a failed term scores 0 for itself only'
      ),
      timeout=Field(
        10.0,
        'seconds per reward call (`env.verify`); a call that overruns scores 0 and is counted in `reward/errors/timeout`',
        kind='positive',
      ),
      workers=Field(
        2,
        'worker processes that run the reward calls (started once per process, reused); `0` calls them in this process, for debugging: no timeout',
        kind='count0',
        rerun=False,
      ),
    ),
  ),
  sampler_mesh=Section(
    "the samplers' own mesh (rollouts, greedy baselines, evaluation)",
    rerun=False,
    fields=dict(
      axes=Field(('data', 'fsdp', 'tensor'), "the sampler mesh's axis names"),
      devices=Field((), 'indices into `jax.devices()` the sampler mesh spans; empty: all'),
      shape=Field(
        (), "the samplers' own mesh (rollouts, greedy baselines, evaluation); empty: the run's mesh"
      ),
    ),
  ),
  seed=Field(
    0, "the run's seed; every random draw of step `s` comes from `fold_in(key, s)`", kind='count0'
  ),
  stage_specs=free(
    'stages of their own by name ([experiments.md](experiments.md#a-pipeline-of-named-stages)): name -> `{kind, start, overrides}` (+ `op`, `inputs`, `kwargs` for a `modelop`); `overrides` sets config keys for that stage only, e.g. `{"kind": "rl", "overrides": {"env": {"name": "digit_sum"}}}`'
  ),
  stages=Field(
    ('pretrain', 'rl', 'eval'),
    'the stages to run, in this order: kinds (`pretrain`, `teacher`, `reward_model`, `sft`, `preference`, `rl`, `modelop`, `eval`; docs/reference.md lists them) or names declared in `stage_specs`',
    rerun=False,
  ),
  tensorboard=Field(True, "write TensorBoard events under each stage's `tb/`", rerun=False),
)
