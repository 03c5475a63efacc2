"""The pipeline steps: one function each, for KFP components, ``python -m trainer`` and tests.

One folder per step with parts of its own, one module for a step without:

- :mod:`trainer.steps.preprocess`: a raw table to validated, encoded splits;
- :mod:`trainer.steps.tune`: the hyperparameter search over the train step's worker config;
- :mod:`trainer.steps.train`: a worker config from the dataset, and the training job launched;
- :mod:`trainer.steps.evaluate`: the model scored, reported and gated;
- :mod:`trainer.steps.register`: the model put into the MLflow model registry;
- :mod:`trainer.steps.figures`: the drawing helpers both reports (evaluate's, tune's) share.

A step folder's ``__init__`` exports what other code may use (the step's function and config,
and the few names another step reads: a file name in the model, the gate's minimum rows); the
rest is the step's own. One step reaches another only through those exports
(``tests/unit/test_layers.py``).

The entry-point wrapper around a step (one error line, exit codes) is :mod:`trainer.entry`.
"""
