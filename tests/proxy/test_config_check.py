"""`sluice config check FILE`: the summary of a usable file, FILE:LINE: FIELD errors with exit 2."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.cli import main
from sluice.filters.config import BUILTIN_DIR

PII_SHA = hashlib.sha256((BUILTIN_DIR / "pii-mask.wasm").read_bytes()).hexdigest()

GOOD = """\
filters:
  - name: pii
    module: builtin:pii-mask
    topics: ["users", "orders-*"]
    apply_to: [produce, fetch]
    config: {mask: "#"}
telemetry:
  dir: telemetry-out
fleet:
  topic: team-filters
  poll_seconds: 1
  trusted_keys: ["ed25519:vnDKY417p3dB5ohpJaxGQtu1aYuhcohrstE93Pr2jC8="]
"""


def write(tmp_path: Path, text: str, name: str = "sluice.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["config", "check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_good_file_prints_filters_with_sha256_topics_and_targets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD)
    code, out, err = run(capsys, str(path))
    assert code == 0, err
    assert f"{path}: OK" in out
    assert "pii: builtin:pii-mask" in out
    assert PII_SHA in out
    assert "users, orders-*" in out
    assert "apply_to fetch, produce" in out
    # Relative telemetry dirs resolve against the config file's directory, as in serve.
    assert f"Parquet datasets in {tmp_path / 'telemetry-out'}" in out
    assert "fleet: topic team-filters" in out
    assert "fleet trust: records signed by key(s) 310763b58f292500" in out
    assert "data policies (x-data-policy): nobody may set them (no policy_admins)" in out
    code, out, err = run(capsys, str(write(tmp_path, GOOD + 'policy_admins: ["User:ops-*"]\n')))
    assert code == 0, err
    assert "data policies (x-data-policy): set by User:ops-*" in out
    assert not (tmp_path / "telemetry-out").exists(), "check must not start the sink"


def test_json_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(write(tmp_path, GOOD)), "--json")
    assert code == 0
    summary = json.loads(out)
    assert summary["ok"] is True
    [f] = summary["filters"]
    assert (f["name"], f["sha256"], f["topics"], f["apply_to"]) == (
        "pii", PII_SHA, ["users", "orders-*"], ["fetch", "produce"])
    assert summary["fleet"]["topic"] == "team-filters"
    assert summary["fleet"]["poll_seconds"] == 1.0


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        ("filters:\n  - name: a\n    module: builtin:pii-mask\n    topics: [t]\n"
         "    apply_to: [prodcue]\n", 5, "filters[0].apply_to[0]", "unknown value 'prodcue'"),
        ("filters:\n  - name: a\n    module: builtin:pii-mask\n    topics: [t]\n"
         "    apply_to: [produce]\n    config: {mask: ''}\n", 2, "filters[0].config",
         "mask must be a non-empty string"),
        # pii-mask's keys/headers switches: the refused key, on its own line
        ("filters:\n  - name: a\n    module: builtin:pii-mask\n    topics: [t]\n"
         "    apply_to: [produce]\n    config:\n      mask: '#'\n      keys: 'no'\n", 8,
         "filters[0].config.keys", "must be true or false"),
        ("filters:\n  - name: a\n    module: builtin:pii-mask\n    topics: [t]\n"
         "    apply_to: [produce]\n    config:\n      headers: [x-user, 3]\n", 7,
         "filters[0].config.headers", "list of header names"),
        ("filters:\n  - name: a\n    module: builtin:nope\n    topics: [t]\n"
         "    apply_to: [produce]\n", 3, "filters[0].module", "unknown builtin"),
        ("telemetry:\n  kafka:\n    topic: t\n", 2, "telemetry.kafka.bootstrap", "required"),
        ("telemetry:\n  dir: x\n  rotate_bytes: lots\n", 3, "telemetry.rotate_bytes",
         "expected"),
        ("fleet:\n  topic: x\n  poll_seconds: -1\n", 3, "fleet.poll_seconds", ">= 0.05"),
        ("fleet:\n  topci: x\n", 2, "fleet.topci", "unknown key"),
        ("proxy: {}\nfilterz: []\n", 2, "filterz", "unknown section"),
        ("proxy:\n  advertized_host: h\n", 2, "proxy.advertized_host", "unknown key"),
        ("fleet: {allow_unsigned: true}\npolicy_admins:\n  - User:ops-*\n  - 7\n", 4,
         "policy_admins[1]", "must be a principal pattern"),
        ("fleet: {allow_unsigned: true}\npolicy_admins: {User: ops}\n", 2, "policy_admins",
         "must be a list"),
    ],
)
def test_errors_name_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int, field: str,
    words: str,
) -> None:
    path = write(tmp_path, text)
    code, out, err = run(capsys, str(path))
    assert code == 2
    assert out == ""
    assert err.startswith(f"sluice config check: {path}:{line}: {field}: "), err
    assert words in err
    code, out, _ = run(capsys, str(path), "--json")
    data = json.loads(out)
    assert (code, data["ok"], data["line"], data["field"]) == (2, False, line, field)


def test_module_that_is_not_wasm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken.wasm").write_bytes(b"\0asm garbage")
    path = write(tmp_path, "filters:\n  - name: b\n    module: broken.wasm\n    topics: [t]\n"
                           "    apply_to: [produce]\n")
    code, _, err = run(capsys, str(path))
    assert code == 2
    assert f"{path}:2: filters[0].module: filter 'b': " in err
    assert "not a valid Wasm module" in err


def test_invalid_yaml_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "filters: [\n")
    code, _, err = run(capsys, str(path))
    assert code == 2 and "invalid YAML" in err and f"{path}:" in err
    code, _, err = run(capsys, str(tmp_path / "absent.yaml"))
    assert code == 2 and "cannot read" in err


def test_command_line_exit_codes_and_no_traceback(tmp_path: Path) -> None:
    bad = write(tmp_path, "filters:\n  - name: a\n    module: builtin:pii-mask\n")
    proc = subprocess.run([sys.executable, "-m", "sluice", "config", "check", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{bad}:2: filters[0].topics: required field is missing" in proc.stderr
    good = write(tmp_path, GOOD, "good.yaml")
    proc = subprocess.run([sys.executable, "-m", "sluice", "config", "check", str(good)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert PII_SHA in proc.stdout


def test_upstream_sasl_password_is_never_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        "upstream_sasl:\n  mechanism: SCRAM-SHA-512\n  username: sluice\n"
        "  password: Sup3r-s3cret-pw\ndead_letters:\n  max_queued_bytes: 1048576\n",
    )
    code, out, err = run(capsys, str(path))
    assert code == 0, err
    assert "upstream_sasl" in out and "password" in out  # the key names, for the reader
    assert "Sup3r-s3cret-pw" not in out + err
    code, out, err = run(capsys, "--json", str(path))
    assert code == 0, err
    assert json.loads(out)["sections"]["upstream_sasl"] == ["mechanism", "password", "username"]
    assert "Sup3r-s3cret-pw" not in out + err
