"""`python -m vantage.server.cli`: the `vantage` command without its executable."""

import sys

from . import main

sys.exit(main())
