"""Kafka's name for the principal of a client that did not authenticate.

One constant, in a module with no dependencies, so that the filter chain, the encrypt filter,
data policies and quotas all match an unauthenticated client as the same principal.
"""

from __future__ import annotations

from typing import Final

ANONYMOUS: Final = "User:ANONYMOUS"
