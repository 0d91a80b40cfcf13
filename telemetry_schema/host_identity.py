"""What telemetry names a host filter by: a digest instead of a module file's sha256.

Host filters (``filters/host.py``) have no module file, so their ``module_sha256`` in telemetry
is the sha256 of ``sluice-host-filter:<kind>:<implementation version>``. This module holds
only that rule and the ``builtin:encrypt`` filter's digest, with no dependency, so that
telemetry writers (the columnar buffers, which keep the encrypt filter's counters in their own
dataset) can recognise its entries without loading the filter machinery.
"""

from __future__ import annotations

import hashlib
from typing import Final


def host_filter_sha256(kind: str, implementation_version: int) -> str:
    """The ``module_sha256`` telemetry reports for a host filter of this kind and version."""
    return hashlib.sha256(
        f"sluice-host-filter:{kind}:{implementation_version}".encode()).hexdigest()


ENCRYPT_KIND: Final = "encrypt"
#: Bumped when the encrypt filter's stored output changes meaning (part of its digest). Not
#: for a new stored layout: records carry their layout version, and the audit job matches
#: this digest, so telemetry written before a layout change stays recognised.
ENCRYPT_IMPLEMENTATION_VERSION: Final = 1
ENCRYPT_SHA256: Final = host_filter_sha256(ENCRYPT_KIND, ENCRYPT_IMPLEMENTATION_VERSION)
