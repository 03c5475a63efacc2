"""``python -m pipelines.cli``: the ``gpupipe`` command."""

import sys

from pipelines.cli import main

sys.exit(main())
