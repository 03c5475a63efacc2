"""What ``gpupipe --help`` and ``--version`` print: help as plain text, the version and images."""

from __future__ import annotations

import argparse
import re
from typing import Any


def plain_text(text: str) -> str:
    """``text`` without the docstring markup that help texts inherit from docstrings:
    ``:func:`x```, ````x```` and ```x``` all become ``x``, so ``--help`` reads as plain text."""
    text = re.sub(r":[a-z]+(?::[a-z]+)?:`~?([^`]+)`", r"\1", text)
    return re.sub(r"`{1,2}([^`]+)`{1,2}", r"\1", text)


class PlainHelp(argparse.HelpFormatter):
    """Help with :func:`plain_text` applied to descriptions, epilogs and each flag's help,
    before argparse wraps them."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))

    def _expand_help(self, action: argparse.Action) -> str:
        return plain_text(super()._expand_help(action))


class PlainRawHelp(PlainHelp, argparse.RawDescriptionHelpFormatter):
    """:class:`PlainHelp` that keeps the description's and epilog's own line breaks."""


def version_text() -> str:
    """``gpupipe --version``: the package version and the image each step is compiled with."""
    from components import ALL
    from components.images import DIGESTS, REGISTRY
    from trainer.base.version import __version__

    steps: dict[str, list[str]] = {}
    for name, component in ALL.items():
        image = component.component_spec.implementation.container.image
        steps.setdefault(str(image), []).append(name)
    width = max(len(image) for image in steps)
    lines = [
        f"gpupipe {__version__}",
        f"images compiled into pipelines (registry {REGISTRY}, GPUPIPE_IMAGE_REGISTRY"
        + (f"; by digest from {DIGESTS}, GPUPIPE_IMAGE_DIGESTS):" if DIGESTS else "):"),
    ]
    lines += [f"  {image:<{width}}  {', '.join(names)}" for image, names in steps.items()]
    return "\n".join(lines)


class Version(argparse.Action):
    """``--version``: print :func:`version_text` and exit 0 (kfp is imported only then)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from trainer.base.errors import error_line

        try:
            text = version_text()
        except ValueError as e:  # GPUPIPE_IMAGE_DIGESTS names no usable map
            parser.exit(2, error_line("gpupipe --version", e) + "\n")
        print(text)
        parser.exit()
