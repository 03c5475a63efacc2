"""Checkpoints: ``step-<n>/`` folders written atomically, verified, resumed from.

``manager`` (the folders' life cycle: write, rename, prune, quarantine, load the newest good
one), ``files`` (what one folder holds and how it is verified; never runs code) and ``dcp``
(FSDP's sharded checkpoints inside the same folders). What goes into a checkpoint is the run's
business: :mod:`trainer.training.state`.
"""
