"""The asyncio IO layer: listeners, sessions, upstream connections, address mapping."""
