"""Sans-IO Kafka protocol: framing, headers, message bodies, record batches, CRC32C.

Bytes in, values out; values in, bytes out. Nothing here imports asyncio or sockets.
Modules: frames (length-prefixed framing), headers (request/response headers), messages (kio
bodies), records (RecordBatch v2), compression, errors; helpers schemas, guard, tolerant.
See docs/CODEC.md.
"""
