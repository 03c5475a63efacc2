"""Container images of the components: one place, tags pinned to the package version, or the
digests a push recorded (``GPUPIPE_IMAGE_DIGESTS``)."""

from __future__ import annotations

import json
import os
import re

from trainer.base.errors import InputError
from trainer.base.version import __version__

REGISTRY = os.environ.get("GPUPIPE_IMAGE_REGISTRY", "ghcr.io/gpupipe")
"""Where images are pulled from; set GPUPIPE_IMAGE_REGISTRY at compile time to change it
(``hack/`` loads locally built images into kind under the default name)."""

DIGESTS = os.environ.get("GPUPIPE_IMAGE_DIGESTS", "")
"""A digest map written by ``hack/build-images.sh --push`` (``{"<registry>/trainer-cpu:<version>":
"<registry>/trainer-cpu@sha256:<64 hex>", ...}``); when set, every image is compiled by its
digest, which a registry cannot serve other content under, instead of by its tag."""

_DIGEST_REF = re.compile(r"^(?P<repo>[^@\s]+)@sha256:[0-9a-f]{64}$")


def pinned(tag_ref: str, digests: str = DIGESTS) -> str:
    """``tag_ref`` by its digest from the map file ``digests`` (itself where none is named).

    Raises:
        InputError: ``E_CONFIG`` naming ``GPUPIPE_IMAGE_DIGESTS`` when the file cannot be read,
            lacks the image, or records a digest of another repository.
    """
    if not digests:
        return tag_ref
    where = f"GPUPIPE_IMAGE_DIGESTS={digests}"
    push = f"GPUPIPE_IMAGE_REGISTRY={REGISTRY} hack/build-images.sh --push"
    try:
        with open(digests, encoding="utf-8") as f:
            table = json.load(f)
    except FileNotFoundError:
        raise InputError("E_CONFIG", f"no digest map there: write it with {push}", where) from None
    except (OSError, ValueError) as e:
        raise InputError("E_CONFIG", f"the digest map cannot be read: {e}", where) from None
    ref = table.get(tag_ref) if isinstance(table, dict) else None
    if ref is None:
        raise InputError(
            "E_CONFIG",
            f"the digest map has no digest for {tag_ref} (images pushed under another registry "
            f"or version?); push it with {push}",
            where,
        )
    match = _DIGEST_REF.match(str(ref))
    if match is None or match["repo"] != tag_ref.rpartition(":")[0]:
        raise InputError(
            "E_CONFIG",
            f"the digest map gives {ref!r} for {tag_ref}: not <repository>@sha256:<64 hex> of "
            f"its repository",
            where,
        )
    return str(ref)


CPU_IMAGE = pinned(f"{REGISTRY}/trainer-cpu:{__version__}")
"""Steps that need no GPU: preprocess, evaluate, register, notify."""

CUDA_IMAGE = pinned(f"{REGISTRY}/trainer-cuda:{__version__}")
"""The train step (its local launcher runs the training processes in the step's own pod)."""
