"""``python -m testbed ...`` is ``a2a-testbed ...`` (what ``torchrun -m testbed`` starts per rank)."""

import sys

from testbed.cli import main

sys.exit(main())
