"""The engine's method hooks (train/hooks.py): the phases of the generic RL step call the active
methods' hooks in the table's order, a hook's output is what the later phases read, a
method's run-state slot is checkpointed (a resumed run equals an uninterrupted one), and the
table's conflicts are refused."""

import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax.train import experiment, hooks
from posttrain_jax.train import workdir as workdir_lib
from tests.train import rl_fixtures

PHASE_ORDER = ("after_rollouts", "before_update", "side_update", "after_update")


def _probe(name: str, calls: list, *, reward: float | None = None, active=True):
  """A method that logs each call and keeps a device counter in its slot ``<name>/count``."""
  slot = f"{name}_count"

  def log(phase):
    calls.append((name, phase))

  def after_rollouts(ctx, run, built, state, gen, key, step, scratch):
    log("after_rollouts")
    assert built == f"built:{name}"
    scratch[name] = step
    if reward is not None:  # what the later phases (advantages, metrics) must see
      gen = gen._replace(rewards=jnp.full_like(gen.rewards, reward))
    return gen, state, {f"{name}/step": float(step)}

  def before_update(ctx, run, built, controls, batch, step, scratch):
    log("before_update")
    assert scratch[name] == step
    return controls

  def side_update(ctx, run, built, state, scratch):
    log("side_update")
    return {**state, slot: state[slot] + 1}, {}

  def after_update(ctx, run, built, state, record, step, scratch):
    log("after_update")
    return state, {f"{name}/count": float(state[slot])}

  return hooks.Method(
    name=name,
    section=f"test.{name}",
    active=lambda config: active,
    build=lambda ctx, init_params: f"built:{name}",
    init_state=lambda ctx, built, init_params: {slot: jnp.zeros((), jnp.int32)},
    after_rollouts=after_rollouts,
    before_update=before_update,
    side_update=side_update,
    after_update=after_update,
  )


def _run(workdir, config, methods) -> list[dict]:
  experiment.run(config, str(workdir), methods=methods)
  return [r for r in rl_fixtures.records(workdir) if r["step"] > 0]


def test_hooks_run_in_phase_then_table_order_and_their_output_is_used(tmp_path):
  calls = []
  table = (
    _probe("a", calls, reward=0.25),
    _probe("off", calls, active=False),
    _probe("b", calls),
  )
  records = _run(tmp_path, rl_fixtures.smoke_config(2), table)
  per_step = [(m, p) for p in PHASE_ORDER for m in ("a", "b")]
  assert calls == per_step * 2  # the inactive method is never called
  # a's rewards replaced the verifier's before the batch metrics and advantages were taken
  assert [r["reward/mean"] for r in records] == [0.25, 0.25]
  assert [r["batch/zero_signal_groups"] for r in records] == [1.0, 1.0]
  assert [r["a/step"] for r in records] == [0.0, 1.0]
  # each method's slot lives in the run state and counts its side updates
  assert [r["a/count"] for r in records] == [1.0, 2.0]
  assert [r["b/count"] for r in records] == [1.0, 2.0]


def test_a_methods_slot_is_checkpointed_and_resumes(tmp_path):
  table = (_probe("a", []),)
  full = _run(tmp_path / "full", rl_fixtures.smoke_config(4), table)
  cut = tmp_path / "cut"
  _run(cut, rl_fixtures.smoke_config(2), table)
  workdir_lib.write_config(str(cut), rl_fixtures.smoke_config(4))  # killed after step 2
  os.remove(os.path.join(cut, "rl", "done.json"))
  shutil.rmtree(os.path.join(cut, "rl", "final"))
  resumed = _run(cut, rl_fixtures.smoke_config(4), table)
  assert [r["a/count"] for r in resumed] == [1.0, 2.0, 3.0, 4.0]
  rl_fixtures.assert_same_records(full, resumed)


def test_the_table_conflicts_are_refused():
  calls = []
  with pytest.raises(ValueError, match="more than once"):
    hooks.check_table((_probe("a", calls), _probe("a", calls)))

  def prefix(*args):
    return None

  config = rl_fixtures.smoke_config(1)
  two = tuple(
    hooks.Method(name=n, section=n, active=lambda c: True, prefix=prefix) for n in ("p", "q")
  )
  ctx = type("Ctx", (), {"methods": two, "config": config})()
  with pytest.raises(ValueError, match=r"\['p', 'q'\] each give the rollouts' prefixes"):
    hooks.build_all(ctx, None)
  same = (_probe("a", calls), hooks.Method(name="z", section="z", active=lambda c: True))
  same = same + (
    hooks.Method(
      name="y",
      section="y",
      active=lambda c: True,
      init_state=lambda ctx, built, p: {"a_count": np.zeros(())},
    ),
  )
  ctx = type("Ctx", (), {"methods": same, "config": config})()
  with pytest.raises(ValueError, match="a_count"):
    hooks.init_states(ctx, hooks.build_all(ctx, None), None)


def test_loss_settings_come_from_the_active_methods_and_may_not_clash():
  from posttrain_jax import defaults, methods
  from posttrain_jax.train import rl

  c = defaults.base_config()
  assert hooks.loss_settings(methods.METHODS, c) == {}  # no teacher: the engine's defaults
  c.rl.teacher.update(loss="jsd", loss_kwargs={"beta": 0.3})
  settings = hooks.loss_settings(methods.METHODS, c)
  assert settings == {"distill": "jsd", "distill_kwargs": (("beta", 0.3),)}
  loss = rl.loss_config(c.rl, (), 0, **settings)
  assert (loss.distill, loss.distill_kwargs) == ("jsd", (("beta", 0.3),))
  on = lambda config: True
  a = hooks.Method("a", "x", on, loss_settings=lambda config: {"distill": "k1"})
  b = hooks.Method("b", "y", on, loss_settings=lambda config: {"distill": "k2"})
  with pytest.raises(ValueError, match=r"method 'b' sets loss settings \['distill'\]"):
    hooks.loss_settings((a, b), c)
