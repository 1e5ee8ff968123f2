"""`python -m hone.cli` (what `torchrun … -m hone.cli train` and each learner rank run)."""

import sys

from hone.cli.main import main

sys.exit(main())
