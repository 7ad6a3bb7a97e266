"""``python -m layerplan``: the same as the ``layerplan`` console script."""

import sys

from layerplan.cli import main

sys.exit(main())
