"""Analyses of finished runs and of models (DESIGN.md section 1: below the engine, above the
math): the OPSD predictive law's estimators (``opsd_law``), plasticity diagnostics of a checkpoint
(``plasticity``: over-confidence, sharpness, gradient cosines; ``scripts/analyze.py``), the
second-order damage of a later domain's update (``interference``), hidden states, the logit
lens, concept vectors, the steering hook's argument and CKA (``representations``), and AUROC /
TPR at a fixed FPR (``detection``), LaRA's contamination metrics (``contamination``), SVEB's
value-estimator scores (``value_benchmark``). Probes and value estimators land here
(docs/architecture.md)."""
