"""Parsing HOST:PORT arguments, with errors a user can act on."""

from __future__ import annotations


def parse_hostport(text: str, what: str = "address") -> tuple[str, int]:
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"{what} {text!r}: expected HOST:PORT")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{what} {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{what} {text!r}: port {port} out of range 0..65535")
    return host, port
