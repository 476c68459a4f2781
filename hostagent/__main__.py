"""``python -m hostagent`` runs the ``fleet-agent`` command line."""

import sys

from hostagent.cli import main

sys.exit(main())
