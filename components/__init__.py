"""KFP v2 components: thin adapters from KFP inputs and outputs to ``trainer.steps``.

Each component lives in its own package (``components/<name>/``) beside its compiled
``component.yaml``, which users can load into their own pipelines with
``kfp.components.load_component_from_file`` (or ``_from_url``).
"""

from components.evaluate import evaluate
from components.fingerprint import fingerprint
from components.notify import notify
from components.preprocess import preprocess
from components.register import register
from components.train import train
from components.tune import tune

ALL = {
    "fingerprint": fingerprint,
    "preprocess": preprocess,
    "tune": tune,
    "train": train,
    "evaluate": evaluate,
    "register": register,
    "notify": notify,
}

__all__ = ["ALL", "evaluate", "fingerprint", "notify", "preprocess", "register", "train", "tune"]
