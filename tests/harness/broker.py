"""The Tansu broker for tests: the same sha256-verified launcher `sluice demo` uses."""

from __future__ import annotations

from sluice.local_broker import TANSU_SHA256, BrokerBinaryError, TansuBroker, tansu_binary

__all__ = ["TANSU_SHA256", "BrokerBinaryError", "TansuBroker", "tansu_binary"]
