"""Sluice: a Kafka wire-protocol proxy that runs a chain of WebAssembly filters on records.

The installed namespace holds the rooms of the house: ``sluice.codec`` (sans-IO Kafka
protocol), ``sluice.filters`` (Wasm filter host and shipped filters), ``sluice.proxy`` (the
asyncio IO layer) and ``sluice.spark_audit`` (the PySpark audit and billing job).
"""

__version__ = "0.1.0"
