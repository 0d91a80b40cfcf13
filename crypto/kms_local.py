"""The embedded ``local`` KMS: key-encryption keys in one JSON file (mode 0600).

The file is created on first use (its directory must exist). Layout:

    {"format": "sluice-keyring", "format_version": 1,
     "keys": {"payments": {"current": 2,
                           "versions": {"1": {"created": "...", "material": "<base64>"},
                                        "2": {"created": "...", "material": "<base64>"}}}}}

Rotation adds a version and makes it current; old versions keep unwrapping what they wrapped.
Deletion erases the material of every version of a name (``"destroyed": "<time>"`` stays in
its place, so version numbers are never reused): every record whose data key was wrapped by
it is unreadable for good. A wrapped data key is ``nonce (12) | AES-256-GCM(KEK, data key)``
with the name and version as associated data.

Several processes (the proxy, ``sluice keys``) share the file: changes are made under an
exclusive ``flock`` on ``<file>.lock`` and written atomically (temporary file + rename); the
keyring re-reads the file when its size, inode or modification time changed.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sluice.crypto.kms import (
    DataKey,
    KeyDestroyed,
    KeyInfo,
    KeyNotFound,
    KmsUnavailable,
    UnwrapFailed,
)

FORMAT: Final = "sluice-keyring"
FORMAT_VERSION: Final = 1
_NONCE: Final = 12


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _wrap_aad(name: str, version: str) -> bytes:
    return b"sluice-keyring/1\x00" + name.encode() + b"\x00" + version.encode()


class LocalKeyring:
    """KEKs in a local file; see the module docstring. Thread-safe."""

    kind = "local"

    def __init__(self, path: Path, *, auto_create: bool = True) -> None:
        self.path = path
        self.auto_create = auto_create
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._data: dict[str, Any] = {"keys": {}}
        self._keks: dict[tuple[str, str], AESGCM] = {}

    # ------------------------------------------------------------------ file
    def _read(self) -> dict[str, Any]:
        """The keyring as on disk (cached until the file changes)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._data, self._keks = None, {"keys": {}}, {}
            return self._data
        except OSError as exc:
            raise KmsUnavailable(f"keyring {self.path}: {exc.strerror or exc}") from None
        if st.st_mode & 0o077:
            raise KmsUnavailable(f"keyring {self.path} is accessible to other users (mode "
                                 f"{stat.S_IMODE(st.st_mode):04o}); chmod 600 it")
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return self._data
        try:
            data = json.loads(self.path.read_bytes())
        except (OSError, ValueError) as exc:
            raise KmsUnavailable(f"keyring {self.path} cannot be read: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(
                data.get("keys"), dict):
            raise KmsUnavailable(f"keyring {self.path} is not a Sluice keyring file")
        if data.get("format_version") != FORMAT_VERSION:
            raise KmsUnavailable(f"keyring {self.path} has format version "
                                 f"{data.get('format_version')!r}; this Sluice reads "
                                 f"{FORMAT_VERSION}")
        self._stamp, self._data, self._keks = stamp, data, {}
        return data

    @contextlib.contextmanager
    def _writing(self) -> Iterator[dict[str, Any]]:
        """The keyring under the file lock; what the block leaves in it is written back."""
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise KmsUnavailable(f"keyring {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            data = json.loads(json.dumps(self._read()))  # a private copy to edit
            data.setdefault("keys", {})
            data["format"], data["format_version"] = FORMAT, FORMAT_VERSION
            yield data
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            fd_tmp = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd_tmp, "w") as fh:
                json.dump(data, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            self._stamp = None
        except OSError as exc:
            raise KmsUnavailable(f"keyring {self.path}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ keys
    def _kek(self, name: str, version: str) -> AESGCM:
        keys = self._read()["keys"]  # re-reads a changed file: a deletion elsewhere counts
        kek = self._keks.get((name, version))
        if kek is not None:
            return kek
        entry = keys.get(name)
        if entry is None:
            raise KeyNotFound(f"no key named {name!r} in keyring {self.path}")
        ver = entry.get("versions", {}).get(version)
        if ver is None:
            raise KeyNotFound(f"key {name!r} has no version {version}")
        if "material" not in ver:
            raise KeyDestroyed(f"key {name!r} version {version} was deleted")
        kek = AESGCM(base64.b64decode(ver["material"]))
        self._keks[(name, version)] = kek
        return kek

    @staticmethod
    def _add_version(data: dict[str, Any], name: str) -> None:
        entry = data["keys"].setdefault(name, {"versions": {}, "current": None})
        versions = entry["versions"]
        number = max((int(v) for v in versions), default=0) + 1
        versions[str(number)] = {"created": _now(),
                                 "material": base64.b64encode(AESGCM.generate_key(256)).decode()}
        entry["current"] = number

    def generate_data_key(self, name: str) -> DataKey:
        with self._lock:
            entry = self._read()["keys"].get(name)
            if entry is None or entry.get("current") is None:
                if not self.auto_create:
                    raise KeyNotFound(f"no key named {name!r} in keyring {self.path} "
                                      "(create it with `sluice keys create`)")
                with self._writing() as data:
                    current = data["keys"].get(name, {}).get("current")
                    if current is None:
                        self._add_version(data, name)
                entry = self._read()["keys"][name]
            version = str(entry["current"])
            kek = self._kek(name, version)
        dek = AESGCM.generate_key(256)
        nonce = os.urandom(_NONCE)
        wrapped = nonce + kek.encrypt(nonce, dek, _wrap_aad(name, version))
        return DataKey(name, version, dek, wrapped)

    def decrypt_data_key(self, name: str, version: str, wrapped: bytes) -> bytes:
        with self._lock:
            kek = self._kek(name, version)
        try:
            return kek.decrypt(wrapped[:_NONCE], wrapped[_NONCE:], _wrap_aad(name, version))
        except (InvalidTag, ValueError):
            raise UnwrapFailed(f"wrapped data key failed authentication under {name!r} "
                               f"version {version}") from None

    # ------------------------------------------------------------------ management
    def _info(self, name: str, entry: dict[str, Any]) -> KeyInfo:
        versions = entry.get("versions", {})
        order = sorted(versions, key=int)
        created = versions[order[0]].get("created") if order else None
        current = entry.get("current")
        return KeyInfo(name, None if current is None else str(current),
                       tuple(v for v in order if "material" in versions[v]),
                       tuple(v for v in order if "material" not in versions[v]), created)

    def list_keys(self) -> list[KeyInfo]:
        with self._lock:
            keys = self._read()["keys"]
            return [self._info(n, keys[n]) for n in sorted(keys)]

    def create_key(self, name: str) -> KeyInfo:
        with self._lock, self._writing() as data:
            if data["keys"].get(name, {}).get("current") is None:
                self._add_version(data, name)
            info = self._info(name, data["keys"][name])
        return info

    def rotate_key(self, name: str) -> KeyInfo:
        with self._lock, self._writing() as data:
            if data["keys"].get(name, {}).get("current") is None:
                raise KeyNotFound(f"no key named {name!r} in keyring {self.path}")
            self._add_version(data, name)
            info = self._info(name, data["keys"][name])
        return info

    def delete_key(self, name: str) -> KeyInfo:
        with self._lock, self._writing() as data:
            entry = data["keys"].get(name)
            if entry is None or entry.get("current") is None:
                raise KeyNotFound(f"no key named {name!r} in keyring {self.path}")
            for ver in entry["versions"].values():
                if ver.pop("material", None) is not None:
                    ver["destroyed"] = _now()
            entry["current"] = None
            info = self._info(name, entry)
        self._keks.clear()
        return info
