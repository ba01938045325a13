"""``python -m chaingate.benchsuite ARGS`` is ``chaingate bench ARGS`` (workers run this)."""

import sys

from chaingate.benchsuite.command import main

sys.exit(main())
