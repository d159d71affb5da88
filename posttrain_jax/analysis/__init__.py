"""Analyses of finished runs and of models (DESIGN.md section 1: below the engine, above the
math): the OPSD predictive law's estimators (``opsd_law``). Probes, value estimators and
concept vectors land here (docs/architecture.md)."""
