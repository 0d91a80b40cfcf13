"""API paths: one module per kind of request the proxy looks into, plus their registry."""
