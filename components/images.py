"""Container images of the components: one place, tags pinned to the package version."""

from __future__ import annotations

import os

from trainer.base.version import __version__

REGISTRY = os.environ.get("GPUPIPE_IMAGE_REGISTRY", "ghcr.io/gpupipe")
"""Where images are pulled from; set GPUPIPE_IMAGE_REGISTRY at compile time to change it
(``hack/`` loads locally built images into kind under the default name)."""

CPU_IMAGE = f"{REGISTRY}/trainer-cpu:{__version__}"
"""Steps that need no GPU: preprocess, evaluate, register, notify."""

CUDA_IMAGE = f"{REGISTRY}/trainer-cuda:{__version__}"
"""The train step (its local launcher runs the training processes in the step's own pod)."""
