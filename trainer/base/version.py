"""The installed gpupipe version, recorded in every model artifact."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def _installed_version() -> str:
    """The version of the installed ``gpupipe`` distribution, or a local marker from a checkout."""
    try:
        return version("gpupipe")
    except PackageNotFoundError:
        # Running straight from a checkout (PYTHONPATH=.), e.g. on the GPU machine.
        return "0.0.0+local"


__version__: str = _installed_version()
