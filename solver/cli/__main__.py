"""``python -m solver.cli``: the same as the ``mtpp`` command."""

import sys

from solver.cli import main

sys.exit(main())
