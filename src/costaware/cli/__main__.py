"""``python -m costaware.cli``: the ``costaware`` command."""

import sys

from costaware.cli import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
