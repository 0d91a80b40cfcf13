"""``python -m sluice.spark_audit``: run the audit job (same options as ``sluice audit``)."""

from __future__ import annotations

import sys

from sluice.spark_audit.job import main

sys.exit(main())
