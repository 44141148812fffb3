"""`python -m experiments.engine`: one run on the in-process engine (see serve.py)."""

import sys

from experiments.engine.serve import main

sys.exit(main())
