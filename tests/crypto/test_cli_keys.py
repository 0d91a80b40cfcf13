"""``sluice keys``: list, create, rotate, delete against a local keyring named by a config."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sluice.cli import main


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "sluice.yaml"
    path.write_text("kms:\n  type: local\n  path: ring.json\n")
    return path


def test_lifecycle(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "list", "--config", str(config)]) == 0
    assert "no keys in the local KMS" in capsys.readouterr().out
    assert main(["keys", "create", "payments", "--config", str(config)]) == 0
    assert main(["keys", "rotate", "payments", "--config", str(config)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(r"payments: current (2-[0-9a-f]{8}); versions 1-[0-9a-f]{8}, \1", last)
    assert main(["keys", "list", "--config", str(config), "--json"]) == 0
    [info] = json.loads(capsys.readouterr().out)
    assert info["name"] == "payments" and [v[:2] for v in info["versions"]] == ["1-", "2-"]
    assert last.endswith(", " + info["versions"][1]) and info["versions"][0] in last
    ring = (config.parent / "ring.json").read_text()
    assert main(["keys", "delete", "payments", "--config", str(config)]) == 2
    assert "add --yes" in capsys.readouterr().err
    assert (config.parent / "ring.json").read_text() == ring  # nothing happened
    assert main(["keys", "delete", "payments", "--config", str(config), "--yes"]) == 0
    out = capsys.readouterr().out
    assert f"payments: deleted; versions -, destroyed {', '.join(info['versions'])}" in out
    assert "material" not in (config.parent / "ring.json").read_text()


def test_errors(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "rotate", "nope", "--config", str(config)]) == 1
    assert "KeyNotFound" in capsys.readouterr().err
    bare = tmp_path / "bare.yaml"
    bare.write_text("filters: []\n")
    assert main(["keys", "list", "--config", str(bare)]) == 2
    assert "no kms: section" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("kms:\n  type: vault\n")
    assert main(["keys", "list", "--config", str(bad)]) == 2
    assert "bad.yaml:2: kms.type: unknown KMS type 'vault'" in capsys.readouterr().err
    assert main(["keys", "list", "--config", str(tmp_path / "missing.yaml")]) == 2
