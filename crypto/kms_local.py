"""The embedded ``local`` KMS: key-encryption keys in one JSON file (mode 0600).

The file is created on first use (its directory must exist). Layout:

    {"format": "sluice-keyring", "format_version": 1,
     "keys": {"payments": {"current": "2-5be1c07a",
                           "versions": {"1-0f3a9c2e": {"created": "...", "material": "<b64>",
                                                       "wraps_reserved": 16384},
                                        "2-5be1c07a": {"created": "...", "material": "<b64>"}}}}}

A version is ``N-RANDOM``: a counter (for people) and 32 random bits, so a keyring restored
from an older backup never issues a version id that records already name with another key
(keyrings of older Sluice versions have plain numbers; they stay readable).

Rotation adds a version and makes it current; old versions keep unwrapping what they wrapped.
Deletion erases the material of every version of a name (``"destroyed": "<time>"`` stays in
its place): every record whose data key was wrapped by it is unreadable for good. Only such a
marker makes a version read as destroyed; a name or version the file does not hold is "not
found" (a retriable error for the proxy: the wrong file, a restored backup), and an entry that
cannot be used is "damaged" (unavailable). A wrapped data key is ``nonce (12) |
AES-256-GCM(KEK, data key)`` with the name and version as associated data.

Wraps are counted: each process reserves blocks of `WRAP_BLOCK` wraps per KEK version in the
file (``wraps_reserved``) before using them, and a version that has reserved `max_wraps`
(default 2^30, well below the 2^32 random-nonce bound of NIST SP 800-38D) is rotated
automatically: however often data keys are made (``data_key_cache_seconds: 0`` makes one per
batch), no KEK version wraps more.

Several processes (the proxy, ``sluice keys``) share the file: changes are made under an
exclusive ``flock`` on ``<file>.lock`` and written atomically (a temporary file created with
O_EXCL|O_NOFOLLOW under a random name, fsynced, renamed, then the directory fsynced); the
keyring re-reads the file when its size, inode or modification time changed.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import secrets
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
#: Wraps a process reserves per KEK version at a time (one file write per block).
WRAP_BLOCK: Final = 1 << 14
#: Wraps after which a KEK version is rotated.
DEFAULT_MAX_WRAPS: Final = 1 << 30


def version_number(version: str) -> int:
    """The counter part of a version id (``3-9f2c01ab`` -> 3; older files: ``3`` -> 3)."""
    head = version.split("-", 1)[0]
    return int(head) if head.isdigit() else 0


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _wrap_aad(name: str, version: str) -> bytes:
    return b"sluice-keyring/1\x00" + name.encode() + b"\x00" + version.encode()


class LocalKeyring:
    """KEKs in a local file; see the module docstring. Thread-safe."""

    kind = "local"

    def __init__(self, path: Path, *, auto_create: bool = True,
                 max_wraps: int = DEFAULT_MAX_WRAPS, wrap_block: int = WRAP_BLOCK) -> None:
        self.path = path
        self.auto_create = auto_create
        self.max_wraps = max_wraps
        self.wrap_block = min(wrap_block, max_wraps)
        #: Wraps this process reserved in the file and has not used yet, per (name, version).
        self._wraps_left: dict[tuple[str, str], int] = {}
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
            # A fresh random name, created exclusively and never through a symlink: nobody
            # can make the key material land in a file of their choosing.
            tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(8)}.tmp")
            fd_tmp = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             0o600)
            try:
                with os.fdopen(fd_tmp, "w") as fh:
                    json.dump(data, fh, indent=1, sort_keys=True)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self._fsync_dir()
            self._stamp = None
        except OSError as exc:
            raise KmsUnavailable(f"keyring {self.path}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)

    def _fsync_dir(self) -> None:
        """Make the rename durable: fsync the directory that holds the keyring."""
        fd = os.open(self.path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
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
        versions = entry.get("versions") if isinstance(entry, dict) else None
        ver = versions.get(version) if isinstance(versions, dict) else None
        if ver is None:
            raise KeyNotFound(f"key {name!r} has no version {version}")
        if not isinstance(ver, dict):
            raise KmsUnavailable(f"keyring {self.path}: key {name!r} version {version} is "
                                 "damaged")
        if "material" not in ver:
            if "destroyed" in ver:
                raise KeyDestroyed(f"key {name!r} version {version} was deleted")
            raise KmsUnavailable(f"keyring {self.path}: key {name!r} version {version} has "
                                 "neither key material nor a deletion record (damaged)")
        try:
            material = base64.b64decode(str(ver["material"]), validate=True)
            kek = AESGCM(material)
            if len(material) != 32:
                raise ValueError("not a 256-bit key")
        except ValueError:
            raise KmsUnavailable(f"keyring {self.path}: the material of key {name!r} version "
                                 f"{version} is damaged") from None
        self._keks[(name, version)] = kek
        return kek

    @staticmethod
    def _add_version(data: dict[str, Any], name: str) -> None:
        entry = data["keys"].setdefault(name, {"versions": {}, "current": None})
        versions = entry["versions"]
        number = max((version_number(str(v)) for v in versions), default=0) + 1
        version = f"{number}-{secrets.token_hex(4)}"
        versions[version] = {"created": _now(),
                             "material": base64.b64encode(AESGCM.generate_key(256)).decode()}
        entry["current"] = version

    def _reserve_wraps(self, name: str) -> str:
        """The current version of `name` with at least one wrap reserved for this process
        (reserving a block in the file, or rotating at `max_wraps`). Under self._lock."""
        with self._writing() as data:
            entry = data["keys"].get(name)
            if entry is None or entry.get("current") is None:
                raise KeyNotFound(f"no key named {name!r} in keyring {self.path}")
            version = str(entry["current"])
            ver = entry["versions"][version]
            reserved = int(ver.get("wraps_reserved", 0))
            if reserved + self.wrap_block > self.max_wraps:
                self._add_version(data, name)  # this version has wrapped enough
                version = str(entry["current"])
                ver = entry["versions"][version]
                reserved = 0
            ver["wraps_reserved"] = reserved + self.wrap_block
        self._wraps_left[(name, version)] = self.wrap_block
        return version

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
            if self._wraps_left.get((name, version), 0) <= 0:
                version = self._reserve_wraps(name)
            self._wraps_left[(name, version)] -= 1
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
        order = sorted(versions, key=lambda v: (version_number(str(v)), str(v)))
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
