"""RL on a band of start pass rates (methods/pass_band/): the pool's annotation as
reasoning-data records, the band's selection, and that RL draws its prompts from the band."""

import numpy as np
import pytest
import rl_fixtures as fx

from posttrain_jax import methods as methods_lib
from posttrain_jax.envs import records
from posttrain_jax.methods import pass_band, rollout_dump
from posttrain_jax.registry import ConfigError


def _config(low: float, high: float, steps: int = 2):
  c = fx.smoke_config(steps)
  c.rl.pass_band.update(pool=24, samples=4, low=low, high=high)
  c.rl.dump_rollouts.every = 1
  return c


def test_in_band_is_inclusive_at_both_ends_up_to_float_error():
  rates = np.array([0.0, 0.125, 3 / 8, 0.5, 0.625 + 1e-12, 0.75, 1.0])
  assert pass_band.in_band(rates, 0.375, 0.625).tolist() == [0, 0, 1, 1, 1, 0, 0]
  assert pass_band.in_band(rates, 0.0, 0.0).tolist() == [1, 0, 0, 0, 0, 0, 0]


def test_rl_draws_only_band_prompts_and_the_records_carry_the_start_pass_rate(tmp_path, coin_env):
  del coin_env  # a random model's answers pass half of the time: the pool's rates spread
  fx.run(tmp_path / "mid", _config(0.5, 0.75))
  rl_dir = tmp_path / "mid" / "rl"
  pool = records.read_records(str(rl_dir / pass_band.RATES_FILE))
  band = records.read_records(str(rl_dir / pass_band.BAND_FILE))
  rates = np.array([r.provenance.base_pass_rate for r in pool])
  assert len(pool) == 24
  # samples=4: every rate is a multiple of 1/4, and the coin spreads them over both sides
  assert np.allclose(rates * 4, np.round(rates * 4)) and rates.min() < 0.5 < rates.max()
  kept = [r for r in pool if 0.5 <= r.provenance.base_pass_rate <= 0.75]
  assert [r.prompt for r in band] == [r.prompt for r in kept] and len(kept) < len(pool)
  assert all(r.provenance.filters == ("pass_band[0.5,0.75]",) for r in band)
  assert all(r.provenance.filters == () for r in pool if r not in kept)
  # every prompt RL sampled is a band prompt, and the step metrics say what was kept
  dumped = {r.prompt for r in records.read_records(str(rl_dir / rollout_dump.FILE))}
  assert dumped <= {r.prompt for r in band}
  metrics = fx.records(tmp_path / "mid")[-1]
  assert metrics["pass_band/kept"] == len(band)
  assert metrics["pass_band/kept_rate"] == pytest.approx(
    np.mean(rates[(rates >= 0.5) & (rates <= 0.75)])
  )
  assert metrics["pass_band/pool_rate"] == pytest.approx(rates.mean())
  # another band of the same start: the same pool and rates, other prompts
  fx.run(tmp_path / "low", _config(0.0, 0.25))
  low_dir = tmp_path / "low" / "rl"
  again = records.read_records(str(low_dir / pass_band.RATES_FILE))
  assert [(r.prompt, r.provenance.base_pass_rate) for r in again] == [
    (r.prompt, r.provenance.base_pass_rate) for r in pool
  ]
  low_dumped = {r.prompt for r in records.read_records(str(low_dir / rollout_dump.FILE))}
  assert low_dumped and not low_dumped & dumped


def test_a_band_no_prompt_reaches_names_the_pool_rates(tmp_path, coin_env):
  del coin_env
  with pytest.raises(ValueError, match=r"no pool prompt has a start pass rate in \[0.1, 0.2\]"):
    methods_lib.run(_config(0.1, 0.2), str(tmp_path))
  assert len(records.read_records(str(tmp_path / "rl" / pass_band.RATES_FILE))) == 24


@pytest.mark.parametrize(
  "change, match",
  [
    (dict(low=0.8, high=0.2), "low=0.8 > high=0.2"),
    (dict(levels=(9,)), "does not cover"),
  ],
)
def test_bad_settings_are_refused_with_the_fix(change, match):
  c = _config(0.0, 1.0)
  c.rl.pass_band.update(**change)
  with pytest.raises(ConfigError, match=match):
    methods_lib.validate(c)


def test_a_dataset_and_a_band_are_refused_together(tmp_path):
  c = _config(0.0, 1.0)
  path = tmp_path / "d.jsonl"
  path.write_text("")
  c.env.dataset = str(path)
  with pytest.raises(ConfigError, match="unset config.env.dataset"):
    methods_lib.validate(c)
