"""TLS for both sides of the proxy: the `tls:` section (towards clients) and `upstream_tls:`
(towards the brokers), parsed from the config file and turned into `ssl.SSLContext` objects.

Parsing resolves relative paths against the config file's directory and builds the context
right away, so an unreadable key or a certificate that does not match its key is reported at
start-up with the file, line and field, not at the first connection.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sluice.filters.yaml_lines import LineMap

ClientAuth = Literal["none", "optional", "required"]
_CLIENT_AUTH: dict[str, ssl.VerifyMode] = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}
_SERVER_KEYS = ("cert", "key", "key_password", "client_ca", "client_auth", "min_version")
_UPSTREAM_KEYS = (
    "enabled",
    "ca",
    "cert",
    "key",
    "key_password",
    "check_hostname",
    "server_hostname",
    "min_version",
)
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


@dataclass(frozen=True)
class ServerTLS:
    """TLS towards clients: the proxy's certificate, and optionally client certificates."""

    cert: Path
    key: Path
    key_password: str | None = None
    client_ca: Path | None = None
    client_auth: ClientAuth = "none"
    min_version: str = "TLSv1.2"

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _VERSIONS[self.min_version]
        ctx.load_cert_chain(str(self.cert), str(self.key), password=self.key_password)
        if self.client_ca is not None:
            ctx.load_verify_locations(cafile=str(self.client_ca))
        ctx.verify_mode = _CLIENT_AUTH[self.client_auth]
        return ctx


@dataclass(frozen=True)
class UpstreamTLS:
    """TLS towards the brokers: trusted CAs, an optional client certificate, hostname check."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    key_password: str | None = None
    check_hostname: bool = True
    server_hostname: str | None = None
    min_version: str = "TLSv1.2"

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = _VERSIONS[self.min_version]
        if self.ca is not None:
            ctx.load_verify_locations(cafile=str(self.ca))
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        if self.cert is not None:
            ctx.load_cert_chain(
                str(self.cert),
                str(self.key) if self.key is not None else None,
                password=self.key_password,
            )
        # The chain is always verified; only the name check can be switched off (brokers
        # reached through addresses their certificates do not list, e.g. a port-forward).
        ctx.check_hostname = self.check_hostname
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def hostname_for(self, host: str) -> str:
        """The name sent as SNI and checked against the broker certificate."""
        return self.server_hostname or host


# ------------------------------------------------------------------ client certificates

_RDN_NAMES = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "stateOrProvinceName": "ST",
    "localityName": "L",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


def _escape_rdn_value(value: str) -> str:
    # RFC 2253 section 2.4: these characters are escaped with a backslash.
    out = "".join("\\" + ch if ch in ',+"\\<>;=' else ch for ch in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" "):
        out = out[:-1] + "\\ "
    return out


def peer_principal(peercert: Any) -> str | None:
    """Kafka's principal for a verified client certificate: ``User:`` + the subject DN in
    RFC 2253 order (``User:CN=app,OU=payments,O=Example``), as Kafka's SSL listeners name it.
    None without a (verified) certificate."""
    if not peercert:
        return None
    subject = peercert.get("subject") or ()
    parts = []
    for rdn in reversed(subject):  # the certificate lists the most significant RDN first
        parts.append(
            "+".join(f"{_RDN_NAMES.get(k, k)}={_escape_rdn_value(str(v))}" for k, v in rdn)
        )
    return "User:" + ",".join(parts) if parts else None


# ------------------------------------------------------------------ parsing


def _check_keys(
    raw: dict[Any, Any], allowed: tuple[str, ...], lines: LineMap, section: str
) -> None:
    for key in raw:
        if key not in allowed:
            raise lines.error((section, key), f"unknown key (expected one of {', '.join(allowed)})")


def _file(
    raw: dict[str, Any], key: str, lines: LineMap, section: str, base: Path | None
) -> Path | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise lines.error((section, key), "must be a file path")
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    if not path.is_file():
        raise lines.error((section, key), f"file not found: {path}")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise lines.error((section, key), f"cannot read {path}: {exc.strerror}") from None
    return path


def _str(raw: dict[str, Any], key: str, lines: LineMap, section: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise lines.error((section, key), "must be a string")
    return value


def _bool(raw: dict[str, Any], key: str, lines: LineMap, section: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise lines.error((section, key), f"must be true or false, got {value!r}")
    return value


def _min_version(raw: dict[str, Any], lines: LineMap, section: str) -> str:
    value = raw.get("min_version", "TLSv1.2")
    if value not in _VERSIONS:
        raise lines.error(
            (section, "min_version"), f"must be one of {', '.join(_VERSIONS)}, got {value!r}"
        )
    return str(value)


def _build_or_fail(make: Any, lines: LineMap, section: str, field: str) -> Any:
    try:
        return make()
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
        raise lines.error((section, field), f"TLS set-up failed: {reason}") from None
    except OSError as exc:
        raise lines.error((section, field), f"TLS set-up failed: {exc.strerror or exc}") from None


def _check_ca(path: Path | None, lines: LineMap, section: str, field: str) -> None:
    if path is None:
        return
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _build_or_fail(lambda: probe.load_verify_locations(cafile=str(path)), lines, section, field)


def parse_server_tls(raw: Any, lines: LineMap, base: Path | None) -> ServerTLS | None:
    """The `tls:` section (None when absent). Raises ConfigError naming file, line and field."""
    section = "tls"
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise lines.error((section,), "must be a mapping")
    _check_keys(raw, _SERVER_KEYS, lines, section)
    cert = _file(raw, "cert", lines, section, base)
    key = _file(raw, "key", lines, section, base)
    if cert is None:
        raise lines.error((section, "cert"), "is required (PEM certificate chain of the proxy)")
    if key is None:
        raise lines.error((section, "key"), "is required (PEM private key of the proxy)")
    client_ca = _file(raw, "client_ca", lines, section, base)
    _check_ca(client_ca, lines, section, "client_ca")
    default_auth = "required" if client_ca is not None else "none"
    client_auth = raw.get("client_auth", default_auth)
    if client_auth not in _CLIENT_AUTH:
        raise lines.error(
            (section, "client_auth"),
            f"must be one of {', '.join(_CLIENT_AUTH)}, got {client_auth!r}",
        )
    if client_auth != "none" and client_ca is None:
        raise lines.error(
            (section, "client_auth"), "client certificates need client_ca (the CA that signs them)"
        )
    tls = ServerTLS(
        cert=cert,
        key=key,
        key_password=_str(raw, "key_password", lines, section),
        client_ca=client_ca,
        client_auth=client_auth,
        min_version=_min_version(raw, lines, section),
    )
    _build_or_fail(tls.context, lines, section, "cert")
    return tls


def parse_upstream_tls(raw: Any, lines: LineMap, base: Path | None) -> UpstreamTLS | None:
    """The `upstream_tls:` section; present (even empty) means TLS unless `enabled: false`."""
    section = "upstream_tls"
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise lines.error((section,), "must be a mapping")
    _check_keys(raw, _UPSTREAM_KEYS, lines, section)
    if not _bool(raw, "enabled", lines, section, True):
        return None
    cert = _file(raw, "cert", lines, section, base)
    key = _file(raw, "key", lines, section, base)
    if key is not None and cert is None:
        raise lines.error((section, "cert"), "a client key needs its certificate (cert)")
    ca = _file(raw, "ca", lines, section, base)
    _check_ca(ca, lines, section, "ca")
    tls = UpstreamTLS(
        ca=ca,
        cert=cert,
        key=key,
        key_password=_str(raw, "key_password", lines, section),
        check_hostname=_bool(raw, "check_hostname", lines, section, True),
        server_hostname=_str(raw, "server_hostname", lines, section),
        min_version=_min_version(raw, lines, section),
    )
    _build_or_fail(tls.context, lines, section, "cert" if cert is not None else "min_version")
    return tls
