"""The run loop: what ``python -m trainer.worker`` does between loading its config and exiting.

``loop`` (``train()``: the loop top to bottom, NaN rollback), ``run`` (``Run``: one run's
objects and its step, with the out-of-memory fallback), ``evaluation`` (validation metrics and
early stopping), ``state`` (the run-state contract: every piece of state a checkpoint holds,
saved and restored through one ``state_dict``/``load_state_dict`` protocol), ``rng`` (seeding
and random states), ``optim`` (AdamW and the learning-rate schedule), ``stop`` (SIGTERM) and
``telemetry`` (JSON log lines, progress, history).
"""
