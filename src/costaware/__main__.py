"""``python -m costaware``: the ``costaware`` command, for an environment whose scripts
folder is not on ``PATH``."""

import sys

from costaware.cli import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
