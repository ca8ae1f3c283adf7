"""``python -m trainmap.plan``: the command (:func:`trainmap.plan.cli.main`)."""

import sys

from trainmap.plan.cli import main

if __name__ == "__main__":
    sys.exit(main())
