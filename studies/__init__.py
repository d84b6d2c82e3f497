"""Studies: XMC runs a hyperparameter search (Optuna's samplers and pruners) over trial work units.

See docs/architecture/studies.md.
"""
