"""`python -m experiments.cli`: the `pflower` command."""

import sys

from .main import main

sys.exit(main())
