"""The RL loop's controllers (train/controls.py): config keys reach the math."""

import jax.numpy as jnp
import pytest

from posttrain_jax import defaults
from posttrain_jax.train import controls as controls_lib


def _rl(**dcmdp):
  c = defaults.base_config().rl
  c.dcmdp.update(enabled=True, delta=0.1, lr=1.0, lam_max=10.0, lam0=1.0, **dcmdp)
  return c


@pytest.mark.parametrize(
  "dcmdp, want",
  [
    ({}, 1.0 + 1.0 * (0.04 - 0.1)),  # plain dual descent below δ
    ({"dead_zone": True}, 1.0),  # no descent below δ
    ({"dead_zone": True, "decay": 0.5}, 0.5),  # only the decay moves λ
    ({"decay": 0.5}, 0.5 * (1.0 + 1.0 * (0.04 - 0.1))),
  ],
)
def test_dcmdp_dead_zone_and_decay_reach_the_update(dcmdp, want):
  cfg = _rl(**dcmdp)
  controls = controls_lib.init_controls(cfg)
  new, logged = controls_lib.after_update(cfg, controls, {"dcmdp/d_hat": jnp.float32(0.04)})
  assert float(new["dcmdp_lam"]) == pytest.approx(want, rel=1e-6)
  assert logged["control/dcmdp_lam"] == pytest.approx(want, rel=1e-6)


def test_inactive_controllers_leave_their_values():
  cfg = defaults.base_config().rl
  controls = controls_lib.init_controls(cfg)
  new, logged = controls_lib.after_update(cfg, controls, {"dcmdp/d_hat": 5.0, "kl/ref": 3.0})
  assert float(new["dcmdp_lam"]) == float(controls["dcmdp_lam"])
  assert set(logged) == {"control/kl_coef"}


def _batch(trainer, sampler, mask):
  from posttrain_jax.train.inputs import TrainBatch

  z = jnp.zeros((trainer.shape[0],), jnp.float32)
  return TrainBatch(
    tokens=jnp.zeros((trainer.shape[0], 2), jnp.int32),
    start=z.astype(jnp.int32),
    mask=mask,
    old_logprobs=trainer,
    behaviour_logprobs=sampler,
    is_weights=mask,
    advantages=z,
    rewards=z,
    group=z.astype(jnp.int32),
    valid=z + 1,
  )


def test_dcmdp_delta_from_the_first_batch_is_set_once_and_drives_the_dual_step():
  """δ = D̂ of the first batch (k3 of recomputed vs sampler log-probs over the mask), then
  fixed; λ's step uses it, and it is logged as ``control/dcmdp_delta``."""
  cfg = _rl(delta_from="first_step")
  controls = controls_lib.init_controls(cfg)
  assert float(controls["dcmdp_delta"]) == controls_lib.UNMEASURED
  trainer = jnp.log(jnp.asarray([[0.5, 0.2, 0.9], [0.3, 0.6, 0.1]], jnp.float32))
  sampler = jnp.log(jnp.asarray([[0.4, 0.2, 0.7], [0.3, 0.5, 0.3]], jnp.float32))
  mask = jnp.asarray([[1, 1, 0], [1, 1, 1]], jnp.float32)
  rho = jnp.exp(trainer - sampler)
  k3 = rho - 1 - jnp.log(rho)
  want = float((k3 * mask).sum() / mask.sum())
  first = controls_lib.before_update(cfg, controls, _batch(trainer, sampler, mask))
  assert float(first["dcmdp_delta"]) == pytest.approx(want, rel=1e-6) and want > 0
  # A later batch with another discrepancy leaves δ where the first one put it.
  again = controls_lib.before_update(cfg, first, _batch(trainer, trainer, mask))
  assert float(again["dcmdp_delta"]) == float(first["dcmdp_delta"])
  new, logged = controls_lib.after_update(cfg, again, {"dcmdp/d_hat": jnp.float32(want + 0.5)})
  assert float(new["dcmdp_lam"]) == pytest.approx(1.0 + 0.5, rel=1e-5)
  assert logged["control/dcmdp_delta"] == pytest.approx(want, rel=1e-6)


def test_dcmdp_delta_value_is_untouched_by_the_first_batch():
  cfg = _rl()
  controls = controls_lib.init_controls(cfg)
  trainer = jnp.zeros((1, 2), jnp.float32)
  out = controls_lib.before_update(cfg, controls, _batch(trainer, trainer - 1.0, trainer + 1))
  assert float(out["dcmdp_delta"]) == pytest.approx(0.1)


def test_dcmdp_delta_from_first_step_needs_recomputed_logprobs():
  from posttrain_jax import methods

  c = defaults.addition_base(0)
  c.rl.dcmdp.update(enabled=True, delta_from="first_step")
  c.rl.old_logprobs = "behaviour"
  with pytest.raises(ValueError, match="old_logprobs='recomputed'"):
    methods.validate(c)
  c.rl.dcmdp.delta_from = "step0"
  with pytest.raises(ValueError, match="delta_from"):
    methods.validate(c)
