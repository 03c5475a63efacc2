"""The model artifact's layout: its format and file names (no torch: the register step, which
only reads ``model.json`` and uploads the files, starts without it)."""

FORMAT = "gpupipe.model/v1"
WEIGHTS_FILE = "model.safetensors"
META_FILE = "model.json"
METRICS_FILE = "metrics.json"
MODEL_STEP = "train"
"""The step whose output marker a model directory carries: only a model replaces a model."""

__all__ = ["FORMAT", "META_FILE", "METRICS_FILE", "MODEL_STEP", "WEIGHTS_FILE"]
