"""The update's inputs (train/inputs.py): which fields a config computes, that the builder
computes exactly those, that every advantage and policy loss gets its declared inputs (the
value the loop computes equals the objectives function on the same inputs), and reward shaping."""

import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import defaults, models, objectives, registry, rollout
from posttrain_jax.methods.teacher import forward as teacher_forward
from posttrain_jax.train import inputs, updates
from posttrain_jax.train import rl as rl_lib
from posttrain_jax.train import state as state_lib

V, EOS, PAD, P, G = 19, 1, 0, 4, 2
ADV_KWARGS = {"pass_at_k": {"k": 2}, "max_at_k": {"k": 2}, "maxpo": {"k": 2}}
LOSS_KWARGS = {"ppo_clip": {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0}}


def _cfg(**rl) -> ml_collections.ConfigDict:
  c = defaults.base_config().rl
  c.update(prompts_per_step=P, group_size=G, max_new_tokens=6)
  for k, v in rl.items():
    if isinstance(v, dict):
      c[k].update(v)
    else:
      c[k] = v
  return c


def test_required_names_exactly_what_the_pieces_read():
  need = lambda **rl: inputs.required(_cfg(**rl))
  assert need() == inputs.Needs(frozenset(), frozenset({"shaped_rewards"}), False)
  assert need(kl_coef=0.1).update == {"ref_logprobs"}
  assert need(kl_coef=0.1, kl_estimator="full_reverse").update == {"ref_logits"}
  n = need(kl_coef=0.1, kl_in_reward=True)
  assert n.update == set() and {"trainer_logprobs", "ref_logprobs"} <= n.advantage and n.trainer
  assert need(advantage="opd").advantage == {"teacher_logprobs", "shaped_rewards"}
  assert need(advantage="remax").advantage == {"baseline_rewards", "shaped_rewards"}
  assert need(advantage="gae").advantage == {"values", "token_rewards", "shaped_rewards"}
  assert need(is_correction="tis").trainer and not need().trainer
  assert need(routing_replay=True).update == {"routes"}


# Numca's number-state keys of the 8 rows x 6 completion tokens (a run parses them from the
# completions' text: inputs._milestones; tests/objectives/test_state_values.py tests the parser).
MILESTONES = jnp.asarray(np.arange(48).reshape(8, 6) % 3 - 1, jnp.int32)


@pytest.fixture(scope="module")
def setup():
  cfg = models.preset("nano", vocab_size=V)
  graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
  prompts = [[5, 6, 7], [8, 9, 10, 11], [12, 13], [5, 9]]
  tokens, mask = rollout.left_pad([p for p in prompts for _ in range(G)], PAD)
  sample = rollout.make_sampler(graphdef, rollout.SamplerConfig(6, EOS, PAD))
  ro = sample(params, tokens, mask, jax.random.key(0))
  ro = ro.replace(group=jnp.repeat(jnp.arange(P, dtype=jnp.int32), G))
  rewards = jnp.asarray([1.0, 0.0, 0.5, 0.5, 0.0, 0.2, 1.0, 0.7], jnp.float32)
  return graphdef, params, ro, rewards


def _ramp(logprobs):
  """A reference 0.25 to 0.75 nats below the policy along the completion: teacher scores that
  vary across tokens (a constant shift leaves GNDPO whitening float noise)."""
  return logprobs - 0.25 - 0.5 * jnp.arange(logprobs.shape[1]) / logprobs.shape[1]


def _fns(graphdef, S, cfg, *, values=None, shift=lambda x: x - 0.25):
  """The functions build_rows calls, as rl.build_run makes them (reference = the policy
  shifted, so teacher / KL inputs are non-trivial)."""
  is_fn = objectives.IS_CORRECTIONS[cfg.is_correction]
  logprob = updates.make_logprob_fn(graphdef, S, 1.0)
  return types.SimpleNamespace(
    advantages=updates.make_advantage_fn(cfg.advantage, rl_lib._items(cfg.advantage_kwargs), P),
    trainer_logprobs=logprob,
    ref_logprobs=lambda p, t, s, r: shift(logprob(p, t, s)),
    is_weights=lambda t, s, m: is_fn(t, s, m),
    mismatch=objectives.mismatch_metrics,
    values=values,
    hidden=updates.make_hidden_fn(graphdef, S),
  )


def _sources(setup, cfg, calls, **fns_kw):
  graphdef, params, ro, _ = setup
  fns = _fns(graphdef, ro.prompt_len, cfg, **fns_kw)
  baseline = jnp.linspace(0.0, 1.0, P * G)
  made = dict(inputs.PRODUCERS)
  if fns.values is not None:  # the critic's field (methods/critic/), here a fixed array
    made["values"] = lambda src, rows, fields: fns.values()
  made["baseline_rewards"] = lambda src, rows, fields: baseline  # ReMax's (methods/remax/)
  made["milestones"] = lambda src, rows, fields: MILESTONES  # parsed from text in a run
  made.update(teacher_forward.PRODUCERS)  # the teacher's (methods/teacher/): the reference here
  producers = {
    k: (lambda k, f: lambda *a: (calls.append(k), f(*a))[1])(k, f) for k, f in made.items()
  }
  src = inputs.Sources(
    fns=fns,
    cfg=cfg,
    params=params,
    ref_params=params,
    controls={"kl_coef": jnp.float32(0.1)},
    methods={"teacher": None},  # no teacher of its own: its log-probs are the reference's
  )
  return src, producers, baseline


@pytest.mark.parametrize("name", sorted(objectives.ADVANTAGES))
def test_every_advantage_gets_its_declared_inputs(setup, monkeypatch, name):
  """The batch's advantages equal the registry function on inputs computed here by hand,
  and only the declared fields are produced."""
  graphdef, params, ro, rewards = setup
  cfg = _cfg(advantage=name, advantage_kwargs=ADV_KWARGS.get(name, {}))
  values = jnp.cumsum(jnp.ones_like(ro.logprobs), axis=1) * 0.1
  calls = []
  src, producers, baseline = _sources(setup, cfg, calls, values=lambda *a: values, shift=_ramp)
  monkeypatch.setattr(inputs, "PRODUCERS", producers)
  monkeypatch.setattr(inputs.Fields.__init__, "__defaults__", (producers,))
  needs = inputs.required(cfg)
  rows = inputs.Rows(ro, jnp.ones(P * G), rewards)
  batch, _, _ = inputs.build_rows(src, rows, needs)
  reads = getattr(objectives.ADVANTAGES[name], "reads", frozenset())
  assert set(calls) - {"routes"} == {"shaped_rewards"} | set(reads) | (
    {"ref_logprobs"} if "teacher_logprobs" in reads else set()
  )
  token_rewards = objectives.terminal_rewards(rewards, ro.completion_mask)
  student = ro.logprobs
  teacher = _ramp(
    updates.make_logprob_fn(graphdef, ro.prompt_len, 1.0)(params, ro.tokens, ro.start)
  )
  want, _ = objectives.ADVANTAGES[name](
    objectives.AdvantageInputs(
      rewards,
      ro.group,
      jnp.ones(P * G),
      ro.completion_mask,
      student,
      teacher_logprobs=teacher,
      values=values,
      baseline_rewards=baseline,
      token_rewards=token_rewards,
      milestones=MILESTONES,
      hidden=updates.make_hidden_fn(graphdef, ro.prompt_len)(params, ro.tokens, ro.start),
    ),
    num_groups=P,
    **ADV_KWARGS.get(name, {}),
  )
  np.testing.assert_allclose(np.asarray(batch.advantages), np.asarray(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(objectives.POLICY_LOSSES))
def test_every_policy_loss_in_the_update_equals_the_objectives_function(setup, name):
  """The update's ``loss/pg`` on a fixed batch (one update, measured before the step) equals
  the registry function on the same log-probs and inputs."""
  graphdef, params, ro, rewards = setup
  S = ro.prompt_len
  kwargs = LOSS_KWARGS.get(name, {})
  old = ro.logprobs - 0.05 * ro.completion_mask  # ratios != 1, so clipping can act
  adv = jnp.asarray(np.random.default_rng(1).normal(size=P * G), jnp.float32)
  batch = inputs.TrainBatch(
    tokens=ro.tokens,
    start=ro.start,
    mask=ro.completion_mask,
    old_logprobs=old,
    behaviour_logprobs=ro.logprobs,
    is_weights=ro.completion_mask,
    advantages=adv,
    rewards=rewards,
    group=ro.group,
    valid=jnp.ones(P * G),
  )
  cfg = updates.RLLossConfig(
    policy_loss=name, policy_loss_kwargs=tuple(sorted(kwargs.items())), num_groups=P
  )
  tx = state_lib.make_optimizer(lr=1e-3, steps=10)
  _, metrics = updates.make_rl_update(graphdef, tx, S, cfg)(
    state_lib.init_state(params, tx),
    batch,
    {"kl_coef": jnp.float32(0.0), "dcmdp_lam": jnp.float32(0.0), "hpo_beta": jnp.float32(1.0)},
    jax.random.key(0),
  )
  logprobs, _ = updates.sequence_logprobs(graphdef, params, ro.tokens, ro.start, S)
  fn = objectives.POLICY_LOSSES[name]
  extra = {f: getattr(batch, f) for f in getattr(fn, "reads", ())}
  want, _ = fn(
    logprobs,
    old,
    adv,
    ro.completion_mask,
    aggregation="token_mean",
    norm_length=None,
    weights=ro.completion_mask,
    **kwargs,
    **extra,
  )
  # The update's forward is one jitted program, the reference's another: float32 log-probs
  # differ in the last bits, and sequence-level weights (VESPO's e^{k log w - λ w}, summed over
  # the tokens) scale that to ~1e-5. Swapping the loss changes the value by far more.
  assert float(metrics["loss/pg"]) == pytest.approx(float(want), rel=1e-4, abs=1e-7)


def test_a_loss_reading_a_new_field_gets_it_from_the_batch(setup, monkeypatch):
  """A policy loss tagged ``reads("ref_logprobs")`` receives the batch's field by name."""
  graphdef, params, ro, rewards = setup
  seen = {}

  @registry.reads("ref_logprobs")
  def pulls_to_ref(logprobs, old_logprobs, advantages, mask, *, ref_logprobs, **_):
    seen["ref"] = ref_logprobs
    loss = objectives.masked_mean(jnp.square(logprobs - ref_logprobs), mask)
    return loss, {"loss/pg": loss}

  monkeypatch.setitem(objectives.POLICY_LOSSES, "pulls_to_ref", pulls_to_ref)
  cfg = _cfg(policy_loss="pulls_to_ref")
  assert inputs.required(cfg).update == {"ref_logprobs"}
  calls = []
  src, _, _ = _sources(setup, cfg, calls)
  batch, _, _ = inputs.build_rows(
    src, inputs.Rows(ro, jnp.ones(P * G), rewards), inputs.required(cfg)
  )
  ref = updates.make_logprob_fn(graphdef, ro.prompt_len, 1.0)(params, ro.tokens, ro.start) - 0.25
  np.testing.assert_allclose(np.asarray(batch.ref_logprobs), np.asarray(ref), rtol=1e-6)
  tx = state_lib.make_optimizer(lr=1e-3, steps=10)
  _, metrics = updates.make_rl_update(
    graphdef, tx, ro.prompt_len, updates.RLLossConfig(policy_loss="pulls_to_ref")
  )(state_lib.init_state(params, tx), batch, {"kl_coef": jnp.float32(0.0)}, jax.random.key(0))
  assert float(metrics["loss/pg"]) == pytest.approx(0.0625, rel=1e-5)  # (0.25)^2 per token


def test_overlong_penalty_matches_its_piecewise_definition():
  L, buf = 12, 4
  lengths = jnp.arange(0, L + 1, dtype=jnp.int32)
  got = np.asarray(objectives.overlong_penalty(lengths, max_length=L, buffer=buf, factor=0.5))
  want = [0.0 if n <= L - buf else 0.5 * ((L - buf) - n) / buf for n in range(L + 1)]
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert got[-1] == -0.5 and got[L - buf] == 0.0
  np.testing.assert_array_equal(
    np.asarray(objectives.overlong_penalty(lengths, max_length=L, buffer=0)), 0.0
  )
  with pytest.raises(ValueError, match="overlong buffer"):
    objectives.overlong_penalty(lengths, max_length=L, buffer=L + 1)


def test_overlong_shaping_in_the_batch(setup):
  """DAPO's shaping through config.rl.reward_shaping: the advantage sees r + penalty, and
  truncated rows are out of the loss (mask 0) but not out of the group statistics."""
  graphdef, params, ro, rewards = setup
  T = ro.completion_mask.shape[1]
  lengths = jnp.asarray([1, 2, 3, 4, 5, 6, 6, 6], jnp.int32)
  truncated = jnp.asarray([0, 0, 0, 0, 0, 0, 1, 1], bool)
  ro = ro.replace(lengths=lengths, truncated=truncated)
  cfg = _cfg(
    advantage="dr_grpo", reward_shaping={"overlong": {"buffer": 3, "mask_truncated": True}}
  )
  src, _, _ = _sources(setup, cfg, [])
  batch, fields, metrics = inputs.build_rows(
    src, inputs.Rows(ro, jnp.ones(P * G), rewards), inputs.required(cfg)
  )
  penalty = np.asarray([0, 0, 0, -1 / 3, -2 / 3, -1, -1, -1], np.float32)
  np.testing.assert_allclose(
    np.asarray(fields["shaped_rewards"]), np.asarray(rewards) + penalty, rtol=1e-6
  )
  shaped = np.asarray(rewards) + penalty
  want = shaped - np.repeat(shaped.reshape(P, G).mean(1), G)
  np.testing.assert_allclose(np.asarray(batch.advantages), want, rtol=1e-5, atol=1e-6)
  mask = np.asarray(batch.mask)
  assert mask[6:].sum() == 0 and mask[:6].sum() == np.asarray(ro.completion_mask)[:6].sum()
  assert float(metrics["shaping/dropped_truncated"]) == 2.0
  assert T == 6


def test_reinforce_pp_token_against_a_numpy_loop():
  rng = np.random.default_rng(3)
  r = rng.normal(size=(5, 7)).astype(np.float32)
  mask = (np.arange(7)[None, :] < np.asarray([7, 3, 5, 1, 6])[:, None]).astype(np.float32)
  got, _ = objectives.ADVANTAGES["reinforce_pp_token"](
    objectives.AdvantageInputs(
      jnp.zeros(5),
      jnp.zeros(5, jnp.int32),
      jnp.ones(5),
      jnp.asarray(mask),
      token_rewards=jnp.asarray(r),
    ),
    num_groups=1,
  )
  ret = np.zeros_like(r)
  for b in range(5):
    acc = 0.0
    for t in reversed(range(7)):
      acc = (r[b, t] if mask[b, t] else 0.0) + acc
      ret[b, t] = acc
  on = mask > 0
  want = np.where(on, (ret - ret[on].mean()) / (ret[on].std() + 1e-8), 0.0)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_kl_per_token_spreads_the_penalty_and_keeps_the_row_sum(setup):
  """k1 with the reference 0.25 nats below the policy: k_t = 0.25 at every completion token.
  Per token: r_t = r 1[t = last] - β k_t; the row sums equal the sequence-level shaping."""
  graphdef, params, ro, rewards = setup
  beta = 0.1
  mask = np.asarray(ro.completion_mask)
  per_token, per_row = {}, {}
  for spread in (False, True):
    cfg = _cfg(
      advantage="reinforce_pp_token",
      kl_coef=beta,
      kl_in_reward=True,
      kl_estimator="k1",
      kl_per_token=spread,
    )
    src, _, _ = _sources(setup, cfg, [])
    src = src._replace(controls={"kl_coef": jnp.float32(beta)})
    _, fields, _ = inputs.build_rows(
      src, inputs.Rows(ro, jnp.ones(P * G), rewards), inputs.required(cfg)
    )
    per_token[spread] = np.asarray(fields["token_rewards"])
    per_row[spread] = np.asarray(fields["shaped_rewards"])
  np.testing.assert_allclose(np.asarray(fields["token_kl"]), 0.25 * mask, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(per_row[True], per_row[False], rtol=1e-6)
  np.testing.assert_allclose(per_token[True].sum(1), per_row[True], rtol=1e-5, atol=1e-6)
  last = mask.sum(1).astype(int) - 1
  terminal = np.zeros_like(mask)
  terminal[np.arange(P * G), last] = np.asarray(rewards)
  np.testing.assert_allclose(per_token[True], terminal - beta * 0.25 * mask, rtol=1e-5, atol=1e-6)
  assert not np.allclose(per_token[True], per_token[False])  # the distribution differs


def test_kl_per_token_is_refused_where_it_changes_nothing():
  from posttrain_jax.methods import validate

  c = defaults.base_config()
  c.rl.update(kl_coef=0.1, kl_in_reward=True, kl_per_token=True)
  with pytest.raises(registry.ConfigError, match="token-level advantages"):
    validate(c)  # grpo reads sequence rewards
  c.rl.advantage = "reinforce_pp_token"
  validate(c)
  c.rl.kl_in_reward = False
  with pytest.raises(registry.ConfigError, match="needs config.rl.kl_in_reward"):
    validate(c)
