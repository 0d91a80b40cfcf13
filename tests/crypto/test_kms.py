"""The KMS clients: the local keyring file and AWS KMS (against moto's server on 127.0.0.1),
held to the same contract; the kms: section's validation; the data-key cache."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.crypto.data_keys import DataKeys
from sluice.crypto.kms import (
    KeyDestroyed,
    KeyNotFound,
    Kms,
    KmsSettings,
    KmsUnavailable,
    UnwrapFailed,
    parse_kms_section,
    settings_from_mapping,
)
from sluice.crypto.kms_aws import AwsKms
from sluice.crypto.kms_local import LocalKeyring, version_number
from sluice.filters.yaml_lines import ConfigError, load_yaml_with_lines
from tests.harness.moto import AWS_ENV, MotoServer


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)


@pytest.fixture(params=["local", "aws"])
def kms(request: pytest.FixtureRequest, tmp_path: Path) -> Kms:
    if request.param == "local":
        return LocalKeyring(tmp_path / "keys.json")
    server: MotoServer = request.getfixturevalue("moto")
    # A fresh alias prefix per test: moto's state is shared by the module.
    prefix = f"t{os.getpid()}-{tmp_path.name}/"
    return AwsKms(KmsSettings("aws", endpoint_url=server.endpoint, auto_create=True,
                              alias_prefix=prefix, timeout_seconds=5))


def test_data_keys_round_trip_and_rotation_keeps_old_versions(kms: Kms) -> None:
    first = kms.generate_data_key("payments")  # created on first use
    assert len(first.plaintext) == 32 and first.wrapped != first.plaintext
    assert "plaintext" not in repr(first) and first.plaintext.hex() not in repr(first)
    assert kms.decrypt_data_key("payments", first.key_version, first.wrapped) == first.plaintext
    info = kms.rotate_key("payments")
    second = kms.generate_data_key("payments")
    assert second.key_version == info.current_version != first.key_version
    assert kms.decrypt_data_key("payments", first.key_version, first.wrapped) == first.plaintext
    assert kms.decrypt_data_key("payments", second.key_version, second.wrapped) == (
        second.plaintext)
    [listed] = [k for k in kms.list_keys() if k.name == "payments"]
    assert set(listed.versions) == {first.key_version, second.key_version}
    assert listed.current_version == second.key_version


def test_delete_shreds_every_version(kms: Kms) -> None:
    old = kms.generate_data_key("gone")
    kms.rotate_key("gone")
    new = kms.generate_data_key("gone")
    info = kms.delete_key("gone")
    assert info.current_version is None and not info.versions
    assert set(info.destroyed_versions) == {old.key_version, new.key_version}
    for dk in (old, new):
        with pytest.raises((KeyDestroyed, KeyNotFound)):
            kms.decrypt_data_key("gone", dk.key_version, dk.wrapped)
    with pytest.raises(KeyNotFound):
        kms.rotate_key("never-made")


def test_a_foreign_wrapped_key_is_refused(kms: Kms) -> None:
    dk = kms.generate_data_key("k1")
    other = kms.generate_data_key("k2")
    with pytest.raises((UnwrapFailed, KeyNotFound)):
        kms.decrypt_data_key("k1", dk.key_version, dk.wrapped[:-1] + bytes([dk.wrapped[-1] ^ 1]))
    with pytest.raises((UnwrapFailed, KeyNotFound)):
        kms.decrypt_data_key("k1", dk.key_version, other.wrapped)


def test_local_keyring_file_is_private_and_shared(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    proxy, tool = LocalKeyring(path), LocalKeyring(path)
    dk = proxy.generate_data_key("payments")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert dk.plaintext not in path.read_bytes()
    assert tool.decrypt_data_key("payments", dk.key_version, dk.wrapped) == dk.plaintext
    tool.delete_key("payments")  # another process deletes it: the proxy notices
    with pytest.raises(KeyDestroyed):
        proxy.decrypt_data_key("payments", dk.key_version, dk.wrapped)
    again = proxy.generate_data_key("payments")  # a new version, never a reused number
    assert version_number(again.key_version) == version_number(dk.key_version) + 1
    assert again.key_version != dk.key_version
    path.chmod(0o644)
    with pytest.raises(KmsUnavailable, match="chmod 600"):
        LocalKeyring(path).list_keys()


def test_local_keyring_without_auto_create(tmp_path: Path) -> None:
    ring = LocalKeyring(tmp_path / "keys.json", auto_create=False)
    with pytest.raises(KeyNotFound, match="sluice keys create"):
        ring.generate_data_key("payments")
    ring.create_key("payments")
    assert version_number(ring.generate_data_key("payments").key_version) == 1


def test_unreadable_keyring_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"{not json")
    os.close(fd)
    with pytest.raises(KmsUnavailable, match="cannot be read"):
        LocalKeyring(path).generate_data_key("x")


def test_aws_unreachable_is_unavailable() -> None:
    from tests.harness.ports import free_port

    dead = AwsKms(KmsSettings("aws", endpoint_url=f"http://127.0.0.1:{free_port()}",
                              timeout_seconds=1))
    with pytest.raises(KmsUnavailable):
        dead.generate_data_key("payments")
    with pytest.raises(KmsUnavailable):
        dead.decrypt_data_key("payments", "0c1a", b"x")


def test_aws_without_auto_create_needs_the_alias(moto: MotoServer) -> None:
    kms = AwsKms(KmsSettings("aws", endpoint_url=moto.endpoint, auto_create=False,
                             alias_prefix="strict/"))
    with pytest.raises(KeyNotFound, match="alias/strict/payments"):
        kms.generate_data_key("payments")
    kms.create_key("payments")
    assert kms.generate_data_key("payments").key_version


# ------------------------------------------------------------------ the kms: section
def parse(tmp_path: Path, text: str) -> KmsSettings | None:
    path = tmp_path / "sluice.yaml"
    path.write_text(text)
    data, lines = load_yaml_with_lines(path)
    return parse_kms_section(data.get("kms"), lines, tmp_path)


def test_kms_section(tmp_path: Path) -> None:
    local = parse(tmp_path, "kms:\n  type: local\n  path: keys.json\n")
    assert local == KmsSettings("local", path=str(tmp_path / "keys.json"), auto_create=True)
    aws = parse(tmp_path, "kms:\n  type: aws\n  region: eu-west-1\n"
                          "  endpoint_url: http://127.0.0.1:4566\n")
    assert aws is not None and aws.auto_create is False and aws.region == "eu-west-1"
    assert parse(tmp_path, "filters: []\n") is None


@pytest.mark.parametrize(("text", "message"), [
    ("kms:\n  type: vault\n", ":2: kms.type: unknown KMS type 'vault'"),
    ("kms:\n  type: local\n", ":1: kms.path: required for type local"),
    ("kms:\n  type: local\n  path: k.json\n  region: x\n", ":4: kms.region: unknown key"),
    ("kms:\n  type: aws\n  endpoint_url: 127.0.0.1\n", ":3: kms.endpoint_url: must be an http"),
    ("kms:\n  type: aws\n  timeout_seconds: 0\n", ":3: kms.timeout_seconds: must be"),
    ("kms:\n  type: local\n  path: k.json\n  auto_create: yes please\n",
     ":4: kms.auto_create: must be true or false"),
    ("kms: [local]\n", ":1: kms: must be a mapping"),
])
def test_kms_section_errors_name_line_and_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(tmp_path, text)
    assert message in str(err.value)


# ------------------------------------------------------------------ data keys
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_data_keys_rotate_by_count_and_age(tmp_path: Path) -> None:
    clock = Clock()
    keys = DataKeys(LocalKeyring(tmp_path / "k.json"), max_records=10, max_age_seconds=60,
                    cache_seconds=90, clock=clock)
    a = keys.for_encrypt("p", 6)
    assert keys.for_encrypt("p", 4) is a  # 10 seals: still within the bound
    b = keys.for_encrypt("p", 1)  # the 11th would exceed it: a fresh key for this batch
    assert b is not a and b.wrapped != a.wrapped and keys.generated == 2
    clock.now += 60
    c = keys.for_encrypt("p", 1)
    assert c is not b and keys.generated == 3


def test_a_deleted_kek_stops_new_data_keys_within_the_cache_time(tmp_path: Path) -> None:
    clock = Clock()
    ring = LocalKeyring(tmp_path / "k.json", auto_create=False)
    ring.create_key("p")
    keys = DataKeys(ring, max_age_seconds=3600, cache_seconds=30, clock=clock)
    first = keys.for_encrypt("p", 1)
    ring.delete_key("p")
    clock.now += 29
    assert keys.for_encrypt("p", 1) is first
    clock.now += 1
    with pytest.raises(KeyNotFound):
        keys.for_encrypt("p", 1)


def test_unwrapped_keys_expire_from_the_cache(tmp_path: Path) -> None:
    clock = Clock()
    ring = LocalKeyring(tmp_path / "k.json")
    dk = ring.generate_data_key("p")
    keys = DataKeys(ring, cache_seconds=30, cache_entries=2, clock=clock)
    keys.for_decrypt("p", dk.key_version, dk.wrapped)
    keys.for_decrypt("p", dk.key_version, dk.wrapped)
    assert keys.unwrapped == 1
    ring.delete_key("p")
    keys.for_decrypt("p", dk.key_version, dk.wrapped)  # still cached: within cache_seconds
    clock.now += 30
    with pytest.raises(KeyDestroyed):
        keys.for_decrypt("p", dk.key_version, dk.wrapped)


def test_settings_from_mapping() -> None:
    assert settings_from_mapping({"type": "local", "path": "k.json"}).path == "k.json"
    with pytest.raises(ConfigError):
        settings_from_mapping({"type": "aws", "bogus": 1})
