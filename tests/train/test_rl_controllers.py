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
