"""Hyperparameter search: one Katib-style search space, run as a Katib Experiment or locally."""
