"""`python -m pjrt_plugins`: the same command line as the `pjrt-plugins` script."""

import sys

from .cli import main

sys.exit(main())
