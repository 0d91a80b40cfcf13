"""Allows ``python -m sluice``."""

from sluice.cli import main

raise SystemExit(main())
