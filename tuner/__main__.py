"""``python -m tuner``: see ``tuner.cli``."""

from tuner.cli import main

raise SystemExit(main())
