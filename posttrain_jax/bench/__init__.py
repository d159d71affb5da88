"""Measurements of the system, not of a paper's method: the speed of the GRPO iteration on the
peers' workloads (``speed``), time to a target accuracy (``time_to_target``), where a compiled
call spends its time (``profile``), Libra's rollout scheduling on this library's own rollouts
(``libra_rollouts``) and in a discrete-event simulation (``libra_sim``). Entry points:
scripts/bench.py, scripts/bench_async.py, scripts/profile_step.py, scripts/libra.py."""
