"""``python -m trainer.launch [torchrun args]``: see :mod:`trainer.launch.torchrun`."""

import sys

from trainer.launch.torchrun import main

sys.exit(main())
