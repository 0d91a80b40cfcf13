"""Networking: listeners, client sessions, the sans-IO connection, TLS, broker addresses."""
