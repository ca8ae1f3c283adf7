"""``python -m trainmap.grid [FILE ...]``: check a configuration without starting Snakemake."""

import sys

from trainmap.grid.validate import main

sys.exit(main())
