"""``python -m anychip``: the same as the ``anychip`` command."""

import sys

from anychip.cli.main import main

sys.exit(main())
