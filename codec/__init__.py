"""Sans-IO Kafka protocol: framing, headers, message bodies, record batches, CRC32C.

Bytes in, values out; values in, bytes out. Nothing here imports asyncio or sockets.
"""
