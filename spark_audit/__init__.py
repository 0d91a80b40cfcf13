"""The PySpark job that turns proxy telemetry into audit, billing and compliance reports."""
