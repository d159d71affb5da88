"""Analyses of finished runs and of models (DESIGN.md section 1: below the engine, above the
math): the OPSD predictive law's estimators (``opsd_law``), plasticity diagnostics of a checkpoint
(``plasticity``: over-confidence, sharpness, gradient cosines; ``scripts/analyze.py``), the
second-order damage of a later domain's update (``interference``). Probes, value estimators and
concept vectors land here (docs/architecture.md)."""
