"""Telemetry tags and ids (telemetry_schema/integrity.py): what a tag covers, that any change
of a tagged unit is refused, that a key file is checked, and that the sinks tag what they
write."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.proxy import telemetry as t
from sluice.proxy.telemetry.parquet import published_name
from sluice.proxy.telemetry.sinks import TelemetryConfigError, parse_telemetry_config
from sluice.telemetry_schema import integrity as ig

KEY = ig.TelemetryKey(ig.key_id(bytes(range(32))), bytes(range(32)))
OTHER = ig.TelemetryKey(ig.key_id(bytes(32)), bytes(32))
FIELDS = [b"inst-a", b"record_batch", b"1", b"inst-a-7"]


def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


@settings(max_examples=200, deadline=None)
@given(value=st.binary(min_size=1, max_size=300), data=st.data())
def test_any_bit_flip_in_a_message_is_refused(value: bytes, data: st.DataObject) -> None:
    tag = ig.Tagger(KEY).tag(ig.KAFKA_ARROW, FIELDS, value)
    verifier = ig.Verifier([KEY])
    assert verifier.check(tag, ig.KAFKA_ARROW, FIELDS, value) is None
    # A flipped bit in the value, in any header the tag covers, or in the tag itself.
    bit = data.draw(st.integers(0, len(value) * 8 - 1))
    assert verifier.check(tag, ig.KAFKA_ARROW, FIELDS, _flip(value, bit)) == ig.BAD_TAG
    which = data.draw(st.integers(0, len(FIELDS) - 1))
    fields = list(FIELDS)
    fields[which] = _flip(fields[which], data.draw(st.integers(0, len(fields[which]) * 8 - 1)))
    assert verifier.check(tag, ig.KAFKA_ARROW, fields, value) == ig.BAD_TAG
    digest_at = tag.index(b":") + 1
    tag_bit = data.draw(st.integers(digest_at * 8, len(tag) * 8 - 1))
    assert verifier.check(_flip(tag, tag_bit), ig.KAFKA_ARROW, FIELDS, value) is not None


def test_what_a_tag_does_not_cover_is_refused() -> None:
    verifier = ig.Verifier([KEY])
    tag = ig.Tagger(KEY).tag(ig.KAFKA_ARROW, FIELDS, b"value")
    assert verifier.check(None, ig.KAFKA_ARROW, FIELDS, b"value") == ig.NO_TAG
    assert verifier.check(b"", ig.KAFKA_ARROW, FIELDS, b"value") == ig.NO_TAG
    assert verifier.check(b"garbage", ig.KAFKA_ARROW, FIELDS, b"value") == ig.BAD_TAG
    # Another kind of unit (a file's tag never verifies a message), moved field bytes.
    assert verifier.check(tag, ig.FILE, FIELDS, b"value") == ig.BAD_TAG
    moved = [b"inst-a" + b"record_batch", b"", b"1", b"inst-a-7"]
    assert verifier.check(tag, ig.KAFKA_ARROW, moved, b"value") == ig.BAD_TAG
    # A tag made with a key the audit does not trust, and a forger's guess under a known id.
    assert verifier.check(ig.Tagger(OTHER).tag(ig.KAFKA_ARROW, FIELDS, b"value"),
                          ig.KAFKA_ARROW, FIELDS, b"value") == ig.UNKNOWN_KEY
    forged = f"{KEY.key_id}:{'0' * 64}".encode()
    assert verifier.check(forged, ig.KAFKA_ARROW, FIELDS, b"value") == ig.BAD_TAG
    # Either of two trusted keys (a rotation).
    both = ig.Verifier([OTHER, KEY])
    assert both.check(tag, ig.KAFKA_ARROW, FIELDS, b"value") is None


def test_event_ids_are_random_and_unrelated() -> None:
    ids = [t.connection_event(t.ProxyInfo("h", 1, "inst"), phase="open", connection_id="c",
                              client_address="a")["event_id"] for _ in range(3000)]
    assert len(set(ids)) == 3000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    # Consecutive ids share no prefix beyond chance (the old ids were <instance>-<counter>).
    shared = sum(a[:4] == b[:4] for a, b in itertools.pairwise(ids))
    assert shared < 5


def test_event_ids_differ_in_a_forked_child() -> None:
    ids = ig.EventIds()
    ids.next()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id goes to the parent
        os.write(write, ids.next().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    assert child != ids.next()


def test_key_files(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.key"
    key = ig.new_key()
    ig.write_key(path, key)
    assert path.stat().st_mode & 0o777 == 0o600
    assert ig.load_key(path) == key
    assert key.secret.hex() not in repr(key)
    with pytest.raises(FileExistsError):
        ig.write_key(path, ig.new_key())
    (tmp_path / "short.key").write_text("abcd\n")
    with pytest.raises(ig.TelemetryKeyError, match=r"short\.key: not a telemetry key"):
        ig.load_key(tmp_path / "short.key")
    with pytest.raises(ig.TelemetryKeyError, match=r"missing\.key: cannot read"):
        ig.load_key(tmp_path / "missing.key")
    settings = parse_telemetry_config({"dir": str(tmp_path), "key_file": str(tmp_path / "x")})
    with pytest.raises(TelemetryConfigError, match=r"telemetry\.key_file: .*x: cannot read"):
        settings.tagger()
    with pytest.raises(TelemetryConfigError, match=r"telemetry\.key_file: expected"):
        parse_telemetry_config({"dir": str(tmp_path), "key_file": 3})


def test_keygen_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sluice.cli import main

    path = tmp_path / "k"
    assert main(["telemetry", "keygen", str(path)]) == 0
    key = ig.load_key(path)
    out = capsys.readouterr().out
    assert key.key_id in out and key.secret.hex() not in out
    assert main(["telemetry", "keygen", str(path)]) == 2
    assert main(["telemetry", "key-id", str(path)]) == 0
    assert capsys.readouterr().out.strip() == key.key_id


def _event(i: int) -> dict[str, object]:
    return t.record_batch_event(
        t.ProxyInfo("h", 1, "inst-a"), connection_id="c", client_address="a", client_id="app",
        principal="alice", api="produce", topic="orders", partition=0, offset_first=i,
        offset_last=i, records_in=1, records_out=1, bytes_in=10, bytes_out=10,
        filters=[t.filter_entry("pii", "ab" * 32, kept=1, detectors={"email": 1})])


def test_parquet_sink_tags_every_published_file(tmp_path: Path) -> None:
    key_file = tmp_path / "telemetry.key"
    ig.write_key(key_file, KEY)
    sink = t.make_sink({"dir": str(tmp_path / "tel"), "key_file": str(key_file)}, "inst-a",
                       proxy=t.ProxyInfo("h", 1, "inst-a"))
    for i in range(5):
        sink.emit(_event(i))
    sink.close(timeout=10)
    files = sorted((tmp_path / "tel").rglob("*.parquet"))
    assert {f.parent.parent.parent.name for f in files} >= {"record_batch", "offset_run",
                                                             "finding"}
    verifier = ig.Verifier([KEY])
    for f in files:
        sidecar = ig.read_sidecar(str(f))
        assert verifier.check_file(published_name(f), f.read_bytes(), sidecar) is None
        assert pq.read_table(f).num_rows >= 1
        # The same bytes under another name in the layout do not verify.
        assert verifier.check_file("record_batch/date=2026-01-01/hour=00/x.parquet",
                                   f.read_bytes(), sidecar) == ig.BAD_TAG


def test_file_sink_tags_each_jsonl_file(tmp_path: Path) -> None:
    sink = t.FileSink(t.ProxyInfo("h", 1, "inst-a"), tmp_path, tagger=ig.Tagger(KEY),
                      rotate_bytes=2000)
    for i in range(20):
        sink.emit(_event(i))
    sink.close(timeout=10)
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) > 1
    verifier = ig.Verifier([KEY])
    lines = 0
    for f in files:
        assert verifier.check_file(f.name, f.read_bytes(), ig.read_sidecar(str(f))) is None
        lines += len(f.read_text().splitlines())
    assert lines == 20
    assert json.loads(files[0].read_text().splitlines()[0])["type"] == "record_batch"


def test_untagged_sink_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sink = t.make_sink({"dir": str(tmp_path)}, "inst-a", proxy=t.ProxyInfo("h", 1, "inst-a"))
    sink.close(timeout=5)
    assert "telemetry is not authenticated" in capsys.readouterr().out
    assert not list(tmp_path.rglob("*.tag"))
