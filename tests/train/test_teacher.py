"""The teacher in the RL step (train/teacher.py): sources, refresh, contexts, the loss term.

One pretrained smoke workdir (nano model, arithmetic) is shared: each test links its pretrain
stage and tokenizer and runs only the stages it needs.
"""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rl_fixtures import assert_same_records, read_jsonl, smoke_config

from posttrain_jax import methods as methods_lib
from posttrain_jax import models
from posttrain_jax.envs import contexts
from posttrain_jax.methods import gkd, validate
from posttrain_jax.methods import teacher as teacher_lib
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import inputs as inputs_lib
from posttrain_jax.train import teacher_model, updates
from posttrain_jax.train import workdir as workdir_lib

CONTEXT = {"context": "hint_digits", "context_kwargs": {"k": 2}}


def teacher_config(steps_: int = 2, **teacher):
  """The RL smoke config (P=4, G=4) with ``config.rl.teacher`` updated by ``teacher``, after
  the shared pretraining (its tokenizer holds the hint context's characters)."""
  c = smoke_config(steps_)
  c.stages = ("pretrain", "rl")  # pretraining is the shared, finished one
  c.rl.teacher.update(teacher)
  return c


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  """A finished pretrain stage (showing the hint context on half its prompts)."""
  workdir = tmp_path_factory.mktemp("teacher_base")
  c = teacher_config(**CONTEXT, pretrain_context=0.5)
  c.stages = ("pretrain", "teacher")
  c.rl.teacher.update(source="stage", preset="tiny", pretrain_steps=4)
  methods_lib.run(c, str(workdir))
  return workdir


def linked(base, workdir, *stages):
  os.makedirs(workdir, exist_ok=True)
  for name in ("pretrain", "tokenizer", *stages):
    os.symlink(os.path.join(base, name), os.path.join(workdir, name))
  return workdir


def rl_records(workdir):
  return [r for r in read_jsonl(os.path.join(workdir, "rl", "metrics.jsonl")) if r["step"] > 0]


def run(base, workdir, config, *stages):
  methods_lib.run(config, str(linked(base, workdir, *stages)))
  return rl_records(workdir)


def test_reference_teacher_gives_zero_signal_at_the_start(base, tmp_path):
  """Without a teacher of its own opd reads the reference: at step 1 it equals the policy."""
  c = teacher_config(1)
  c.rl.update(advantage="opd", policy_loss="gspo")
  (r,) = run(base, tmp_path, c)
  assert abs(r["distill/score_mean"]) < 1e-4
  assert r["teacher/kl"] < 1e-6


def test_larger_teacher_from_its_own_stage(base, tmp_path):
  """source='stage': a tiny teacher (the student is nano) pretrained in this run's teacher
  stage; its scores differ from the student's at step 1."""
  c = teacher_config(1, source="stage", preset="tiny", pretrain_steps=4)
  c.stages = ("pretrain", "teacher", "rl")
  c.rl.update(advantage="opd", policy_loss="gspo")
  (r,) = run(base, tmp_path, c, "teacher")
  assert abs(r["distill/score_mean"]) > 1e-2
  assert r["teacher/kl"] > 1e-2


def test_teacher_from_a_path_and_a_vocabulary_mismatch(base, tmp_path):
  """source='path' loads a run's STAGE/final; a teacher with another tokenizer is refused."""
  c = teacher_config(1, source="path", path=os.path.join(base, "teacher", "final"))
  c.rl.update(advantage="opd", policy_loss="gspo")
  (r,) = run(base, tmp_path / "ok", c)
  assert abs(r["distill/score_mean"]) > 1e-2
  other = tmp_path / "other_run"
  os.makedirs(other / "pretrain" / "final")
  shutil.copy(os.path.join(base, "config.json"), other / "config.json")
  models.save_tokenizer(models.build_char_tokenizer("0123456789+=xyz"), str(other / "tokenizer"))
  student = models.load_tokenizer(os.path.join(base, "tokenizer"))
  with pytest.raises(ConfigError, match="differs from the student's"):
    teacher_model.load_path(str(other / "pretrain" / "final"), student, None)


def test_temperature_scaled_self_distillation_starts_at_zero(base, tmp_path):
  """TS-OPSD at tau = 1 from the start: the teacher is the student at step 1, forward KL 0;
  at tau = 2 it is not. The phase: distillation only for one step, then the policy loss."""
  c = teacher_config(2, loss="forward", temperature=1.0, steps=1, pg_during=False)
  r1, r2 = run(base, tmp_path / "t1", c)
  assert r1["loss/distill"] < 1e-6
  assert (r1["control/distill_coef"], r1["control/pg_coef"]) == (1.0, 0.0)
  assert (r2["control/distill_coef"], r2["control/pg_coef"]) == (0.0, 1.0)
  c = teacher_config(1, loss="forward", temperature=2.0)
  (r,) = run(base, tmp_path / "t2", c)
  assert r["loss/distill"] > 1e-3


def test_snapshot_teacher_refreshes_on_its_period(base, tmp_path):
  """rule 'every' period 2: refreshed after steps 2 and 4; right after a refresh the teacher
  is the policy that samples (temporal KL ~0), between refreshes it lags (KL > 0)."""
  c = teacher_config(4, loss="k3", coef=0.1, rule="every", rule_kwargs={"period": 2})
  c.rl.update(lr=1e-3, entropy_coef=1.0)  # moves the policy whatever the (flat) rewards
  rs = run(base, tmp_path, c)
  assert [r["teacher/refreshed"] for r in rs] == [0.0, 1.0, 0.0, 1.0]
  assert rs[2]["teacher/kl"] < 1e-5  # the step after a refresh
  assert rs[1]["teacher/kl"] > 1e-4  # one update behind, not refreshed yet
  assert rs[0]["teacher/kl"] < 1e-5  # the start


def test_ema_teacher_resumes_exactly(base, tmp_path):
  """An EMA teacher (its copy and its rule's state are checkpointed): a run stopped after its
  step-2 checkpoint and resumed records what an uninterrupted run records."""
  make = lambda n: teacher_config(n, loss="forward", rule="ema", rule_kwargs={"alpha": 0.5})
  full = run(base, tmp_path / "full", make(4))
  config = make(2)
  first = run(base, tmp_path / "resumed", config)
  assert len(first) == 2
  workdir_lib.write_config(str(tmp_path / "resumed"), make(4))
  os.remove(tmp_path / "resumed" / "rl" / "done.json")
  shutil.rmtree(tmp_path / "resumed" / "rl" / "final")
  methods_lib.run(make(4), str(tmp_path / "resumed"))
  assert_same_records(full, rl_records(tmp_path / "resumed"))


def test_privileged_context_in_the_teacher_prompt_only(base, tmp_path):
  """OPSD: the policy with the hint teaches itself without it; the evaluator reports the
  policy's accuracy with the hint (eval/teacher_accuracy) beside eval/accuracy."""
  c = teacher_config(1, source="policy", loss="forward", pg_during=False, **CONTEXT)
  c.rl.eval_every = 1
  (r,) = run(base, tmp_path, c)
  assert r["loss/distill"] > 1e-4  # the hint changes the teacher's distribution
  assert "eval/teacher_accuracy" in r and "eval/accuracy" in r
  step0 = read_jsonl(os.path.join(tmp_path, "rl", "metrics.jsonl"))[0]
  assert step0["step"] == 0 and "eval/teacher_accuracy" in step0


def test_no_gradient_reaches_the_teacher():
  """The update's loss has zero gradient with respect to the teacher's logits and log-probs."""
  cfg = updates.RLLossConfig(distill="forward")
  graphdef, params = models.init_decoder(models.preset("nano", vocab_size=11), 0)
  B, S, T, V = 2, 3, 4, 11
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, V, (B, S + T)), jnp.int32)
  f32 = lambda *s: jnp.asarray(np.random.default_rng(1).normal(size=s), jnp.float32)
  batch = inputs_lib.TrainBatch(
    tokens=tokens,
    start=jnp.zeros(B, jnp.int32),
    mask=jnp.ones((B, T)),
    old_logprobs=-jnp.ones((B, T)),
    behaviour_logprobs=-jnp.ones((B, T)),
    is_weights=jnp.ones((B, T)),
    advantages=jnp.ones(B),
    rewards=jnp.ones(B),
    group=jnp.zeros(B, jnp.int32),
    valid=jnp.ones(B),
    teacher_logits=f32(B, T, V),
  )
  controls = {
    "kl_coef": 0.0,
    "dcmdp_lam": 0.0,
    "hpo_beta": 0.0,
    "distill_coef": 1.0,
    "pg_coef": 1.0,
  }
  loss = lambda t: updates.rl_loss(
    params, batch.replace(teacher_logits=t), controls, graphdef=graphdef, prompt_len=S, cfg=cfg
  )[0]
  assert float(jnp.abs(jax.grad(loss)(batch.teacher_logits)).max()) == 0.0
  grad_params = jax.grad(
    lambda p: updates.rl_loss(p, batch, controls, graphdef=graphdef, prompt_len=S, cfg=cfg)[0]
  )(params)
  assert float(max(jnp.abs(g).max() for g in jax.tree.leaves(grad_params))) > 0.0


@pytest.mark.parametrize(
  "teacher, message",
  [
    ({"source": "stage"}, "add 'teacher' to config.stages"),
    ({"source": "path"}, "needs config.rl.teacher.path"),
    (
      {"rule": "every", "source": "policy", "context": "answer"},
      "needs config.rl.teacher.source='start'",
    ),
    ({"context": "telepathy"}, "valid contexts"),
    ({"loss": "wasserstein"}, "valid losses"),
    ({"rule": "ema", "rule_kwargs": {"alpha": 1.5}}, "config.rl.teacher.rule_kwargs.alpha"),
    ({"source": "policy", "loss": "forward", "context": "none"}, "the student itself"),
    ({"lmbda": 0.5, "loss": "forward"}, "pg_during=False"),
    ({"lmbda": 0.5}, "needs config.rl.teacher.loss"),
  ],
)
def test_bad_teacher_configs_are_refused(teacher, message):
  c = smoke_config(1)
  c.rl.teacher.update(teacher)
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    validate(c)


def test_pretraining_rows_with_a_context_keep_their_answers(tmp_path):
  """The corpus's context rows are longer than the student's prompts: every row keeps its
  whole answer and EOS under the loss mask."""
  from posttrain_jax.train import pretrain

  c = teacher_config(**{"context": "feedback", "pretrain_context": 1.0})
  validate(c)
  ctx = methods_lib.make_context(c, str(tmp_path))
  seq_len = pretrain._prompt_len(ctx) + c.rl.max_new_tokens  # pylint: disable=protected-access
  assert seq_len > ctx.prompt_len + c.rl.max_new_tokens
  batch = pretrain.sft_batch(ctx, jax.random.key(0), 32, seq_len, 0.0)
  pairs = contexts.context_corpus(
    ctx.env, jax.random.key(0), 32, level=c.env.level, noise=0.0, name="feedback", fraction=1.0
  )
  assert all("|" in p for p, _ in pairs)
  assert batch["loss_mask"].sum(axis=1).tolist() == [len(a) + 1 for _, a in pairs]


def test_feedback_is_only_in_the_teacher_context(tmp_path):
  """teacher_inputs: the teacher's rows are context + prompt, then the student's completion
  tokens unchanged; the feedback is about each row's own completion; the student's rows carry
  no context character."""
  from posttrain_jax import rollout

  c = teacher_config(
    **{"context": "feedback", "loss": "forward", "pg_during": False, "rule": "ema"}
  )
  validate(c)
  ctx = methods_lib.make_context(c, str(tmp_path))
  env = ctx.env
  problems = [env.make(123, 456, 3), env.make(5, 7, 3)]
  completions = ["569", "12"]  # wrong at the 3rd digit; right
  S, T = ctx.prompt_len, 6
  prompt_ids, prompt_mask = rollout.encode_prompts(
    ctx.tokenizer, [p.prompt for p in problems], length=S
  )
  comp = [
    ctx.tokenizer(x, add_special_tokens=False)["input_ids"] + [ctx.tokenizer.eos_token_id]
    for x in completions
  ]
  comp_ids = np.full((2, T), ctx.tokenizer.pad_token_id, np.int32)
  comp_mask = np.zeros((2, T), np.float32)
  for i, ids in enumerate(comp):
    comp_ids[i, : len(ids)], comp_mask[i, : len(ids)] = ids, 1.0
  ro = rollout.Rollout(
    tokens=jnp.asarray(np.concatenate([prompt_ids, comp_ids], 1)),
    prompt_mask=jnp.asarray(prompt_mask),
    completion_mask=jnp.asarray(comp_mask),
    logprobs=jnp.zeros((2, T)),
    lengths=jnp.asarray(comp_mask.sum(1), jnp.int32),
    truncated=jnp.zeros(2, bool),
    group=jnp.arange(2),
    policy_version=jnp.zeros(2, jnp.int32),
  )
  teacher = teacher_lib.Teacher(
    forward=None, prompt_len=teacher_model.context_prompt_len(ctx, c.rl), context="feedback"
  )
  tokens, start = teacher_lib.teacher_inputs(ctx, teacher, problems, ro, jax.random.key(0))
  tokens, start = np.asarray(tokens), np.asarray(start)
  S_T = teacher.prompt_len
  assert S_T > S
  np.testing.assert_array_equal(tokens[:, S_T:], comp_ids)  # the student's tokens, unchanged
  texts = [ctx.tokenizer.decode(tokens[i, start[i] : S_T]) for i in range(2)]
  assert texts == ["56!57|123+456=", "OK|005+007="]
  student = [
    ctx.tokenizer.decode(np.asarray(ro.tokens)[i, :S], skip_special_tokens=True) for i in range(2)
  ]
  assert all("|" not in s and "!" not in s and "OK" not in s for s in student)


def test_reference_refresh_like_trl_sync_ref_model(base, tmp_path):
  """rl.ref_rule 'every' period 1, alpha 1: the KL reference is the policy that sampled each
  step (kl/ref ~0 at step 2), while the frozen reference lags (kl/ref > 0)."""
  synced = teacher_config(2)
  synced.rl.update(
    kl_coef=0.1,
    lr=1e-3,
    entropy_coef=1.0,
    ref_rule="every",
    ref_rule_kwargs={"period": 1, "alpha": 1.0},
  )
  frozen = teacher_config(2)
  frozen.rl.update(kl_coef=0.1, lr=1e-3, entropy_coef=1.0)
  s = run(base, tmp_path / "synced", synced)
  f = run(base, tmp_path / "frozen", frozen)
  assert s[1]["kl/ref"] < 1e-6 < 1e-4 < f[1]["kl/ref"]
  assert [r["reference/refreshed"] for r in s] == [1.0, 1.0]


def test_gkd_jsd_from_a_larger_teacher(base, tmp_path):
  """GKD: the generalised JSD (beta 0.5) to the teacher stage's model, distillation only."""
  c = teacher_config(
    1,
    source="stage",
    preset="tiny",
    pretrain_steps=4,
    loss="jsd",
    loss_kwargs={"beta": 0.5},
    pg_during=False,
  )
  c.stages = ("pretrain", "teacher", "rl")
  (r,) = run(base, tmp_path, c, "teacher")
  assert 1e-3 < r["loss/distill"] < np.log(2)  # JSD is bounded by log 2
  assert r["control/pg_coef"] == 0.0


def test_teacher_from_a_hugging_face_folder(base, tmp_path):
  """source='path' with a Hugging Face folder (a random nano decoder saved with the student's
  tokenizer) scores the student's samples; one saved with another tokenizer is refused."""
  from flax import nnx

  student = models.load_tokenizer(os.path.join(base, "tokenizer"))
  config = models.preset("nano", vocab_size=len(student), max_seq_len=128)
  hf = str(tmp_path / "hf")
  models.save_pretrained(models.Decoder(config, rngs=nnx.Rngs(7)), config, hf, tokenizer=student)
  c = teacher_config(1, source="path", path=hf)
  c.rl.update(advantage="opd", policy_loss="gspo")
  (r,) = run(base, tmp_path / "run", c)
  assert r["teacher/kl"] > 1e-3  # another model (the reference teacher gives < 1e-6)
  other = models.build_char_tokenizer("0123456789+=")
  other_cfg = models.preset("nano", vocab_size=len(other), max_seq_len=128)
  models.save_pretrained(
    models.Decoder(other_cfg, rngs=nnx.Rngs(0)),
    other_cfg,
    str(tmp_path / "hf_other"),
    tokenizer=other,
  )
  with pytest.raises(ConfigError, match="differs from the student's"):
    teacher_model.load_path(str(tmp_path / "hf_other"), student, None)


def test_teacher_params_by_source():
  """The policy teacher reads the live policy even when the run keeps a reference (KL)."""
  ref, policy, copy, fixed = object(), object(), object(), object()
  make = lambda **kw: teacher_lib.Teacher(forward=None, prompt_len=8, **kw)
  assert make(source="policy").params({}, ref, policy) is policy
  assert make(source="start").params({}, ref, policy) is ref
  assert make(source="start").params({"teacher": copy}, ref, policy) is copy
  assert make(source="stage", fixed=fixed).params({}, ref, policy) is fixed


def test_gkd_lambda_answer_completions_and_the_coin():
  tokenizer = models.build_char_tokenizer("0123456789+=")
  tokens, mask, lengths, trunc = gkd.answer_completions(tokenizer, ["12", "3", "98765"], 4)
  ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
  eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
  np.testing.assert_array_equal(
    tokens, [ids("12") + [eos, pad], ids("3") + [eos, pad, pad], ids("9876")]
  )
  np.testing.assert_array_equal(mask.sum(1), [3, 2, 4])
  np.testing.assert_array_equal(lengths, [3, 2, 4])
  np.testing.assert_array_equal(trunc, [False, False, True])
  cfg = smoke_config(1).rl
  cfg.teacher.update(loss="forward", pg_during=False, steps=300, lmbda=0.3)
  draws = [gkd.off_policy(cfg, s, jax.random.key(s)) for s in range(300)]
  assert 0.6 < np.mean(draws) < 0.8  # off-policy with probability 1 - lmbda
  assert draws == [gkd.off_policy(cfg, s, jax.random.key(s)) for s in range(300)]
  assert not gkd.off_policy(cfg, 300, jax.random.key(0))  # after the distillation phase
  cfg.teacher.lmbda = 1.0
  assert not any(gkd.off_policy(cfg, s, jax.random.key(s)) for s in range(50))


def test_gkd_lambda_distils_on_reference_answers(base, tmp_path):
  """lmbda=0: every step of the distillation phase distils on the problems' answers (the same
  sampled rows otherwise: the loss and the temporal KL differ from lmbda=1's), then on-policy."""

  def config(lmbda):
    c = teacher_config(
      3,
      source="stage",
      preset="tiny",
      pretrain_steps=4,
      loss="jsd",
      loss_kwargs={"beta": 0.5},
      pg_during=False,
      steps=2,
      lmbda=lmbda,
    )
    c.stages = ("pretrain", "teacher", "rl")
    return c

  off = run(base, tmp_path / "off", config(0.0), "teacher")
  on = run(base, tmp_path / "on", config(1.0), "teacher")
  assert [r["gkd/off_policy"] for r in off] == [1.0, 1.0, 0.0]
  assert "gkd/off_policy" not in on[0]
  assert off[0]["reward/mean"] == on[0]["reward/mean"]  # the same samples were drawn
  assert abs(off[0]["loss/distill"] - on[0]["loss/distill"]) > 1e-4
  assert abs(off[0]["teacher/kl"] - on[0]["teacher/kl"]) > 1e-4


def test_feedback_context_g0_reads_the_policys_own_greedy_attempts(base, tmp_path, monkeypatch):
  """OPSD's G0 with the feedback context: the evaluation first decodes each problem greedily
  without a context, then builds the feedback on that attempt (the same completions the plain
  evaluation scores), then evaluates with it (eval/teacher_accuracy)."""
  from posttrain_jax import envs

  seen = []
  arithmetic = envs.ENVS["arithmetic"]
  original = type(arithmetic).feedback

  def feedback(self, problem, completion):
    seen.append((problem, completion))
    return original(self, problem, completion)

  monkeypatch.setattr(type(arithmetic), "feedback", feedback)
  c = teacher_config(1, source="policy", context="feedback", loss="forward", pg_during=False)
  c.rl.eval_every = 1
  methods_lib.run(c, str(linked(base, tmp_path)))
  first = read_jsonl(os.path.join(tmp_path, "rl", "metrics.jsonl"))[0]
  assert first["step"] == 0 and 0.0 <= first["eval/teacher_accuracy"] <= 1.0
  # Config validation builds one context from a sample problem's own answer: skip those.
  probe = arithmetic.sample(jax.random.key(0), 1, level=c.env.level)[0]
  while seen and seen[0] == (probe, probe.answer):
    seen.pop(0)
  attempts = seen[: c.rl.eval_problems]  # step 0's evaluation: one feedback per problem
  assert len(attempts) == c.rl.eval_problems
  assert all(isinstance(a, str) for _, a in attempts)
  # The plain evaluation's accuracy is the score of exactly those attempts.
  scores = [arithmetic.verify(p, a) for p, a in attempts]
  assert np.mean(scores) == pytest.approx(first["eval/accuracy"])
