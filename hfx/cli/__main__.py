"""``python -m hfx.cli``."""

import sys

from hfx.cli import main

sys.exit(main())
