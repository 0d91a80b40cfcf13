"""Test harness: real processes (the Tansu broker, the sluice proxy) started on 127.0.0.1."""
