"""The telemetry schema: the contract between the proxy's telemetry writers and the audit job.

``columns`` (the columnar datasets and the buffers that fill them), ``integrity`` (the
telemetry key, event ids and the HMAC tags every message and published file carries) and
``host_identity`` (the digest telemetry names a host filter by). The proxy writes with them,
``sluice.spark_audit`` reads with them; this package imports only pyarrow and the standard
library, so the audit job's Spark workers load nothing of the proxy.
"""
