"""The pipeline steps: one function each, for KFP components, ``python -m trainer`` and tests.

The entry-point wrapper around a step (one error line, exit codes) is :mod:`trainer.entry`.
"""
