"""``python -m gradstore``: the same as the ``gradstore`` command."""

import sys

from .cli import main

sys.exit(main())
