"""`sluice filter new/build/test`: the template builds and passes `sluice filter test`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sluice.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


ENTRY = {"c": "filter.c", "zig": "filter.zig", "rust": "filter.rs",
         "assemblyscript": "filter.ts", "go": "filter.go", "js": "filter.js",
         "python": "filter.py"}


@pytest.mark.parametrize("lang", sorted(ENTRY))
def test_template_new_build_test(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 lang: str) -> None:
    code, out, _ = run_cli(capsys, "filter", "new", "starter", "--lang", lang,
                           "--dir", str(tmp_path))
    assert code == 0, out
    d = tmp_path / "starter"
    assert (d / ENTRY[lang]).is_file()
    assert "{{NAME}}" not in (d / ENTRY[lang]).read_text()
    assert "starter.wasm" in (d / "README.md").read_text()

    code, out, err = run_cli(capsys, "filter", "build", str(d))
    assert code == 0, err
    wasm = d / "starter.wasm"
    assert f"sha256 {hashlib.sha256(wasm.read_bytes()).hexdigest()}" in out

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text('suffix: " (ok)"\n')
    results = tmp_path / "out.jsonl"
    code, out, err = run_cli(capsys, "filter", "test", str(wasm), "--input",
                             str(d / "sample.jsonl"), "--config", str(cfg),
                             "--output", str(results))
    assert code == 0, err
    assert "line 2 orders/0: REJECT   starter: a record needs a value" in out
    assert "line 3 orders/0: DROP" in out
    assert "summary: rewrite 2, drop 1, reject 1" in out
    assert "counters: dropped=1, rejected_empty=1, tagged=2" in out
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    assert [x["decision"] for x in lines] == ["rewrite", "reject", "drop", "rewrite"]
    assert lines[0]["value"] == '{"order": 1} (ok)'
    assert lines[0]["headers"] == [["source", "web"]]
    assert lines[3]["value"] == {"base64": "AAEC/yAob2sp"}  # binary stays binary
    assert lines[3]["key"] is None
    assert lines[1]["reason"] == "starter: a record needs a value"


def test_build_output_option_and_reproducible(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capsys, "filter", "new", "a", "--dir", str(tmp_path))[0] == 0
    assert run_cli(capsys, "filter", "new", "b", "--dir", str(tmp_path / "deeper" / "x"))[0] == 0
    # the same source in two places builds to the same bytes
    (tmp_path / "deeper" / "x" / "b" / "filter.c").write_text(
        (tmp_path / "a" / "filter.c").read_text())
    assert run_cli(capsys, "filter", "build", str(tmp_path / "a"), "-o",
                   str(tmp_path / "one.wasm"))[0] == 0
    assert run_cli(capsys, "filter", "build", str(tmp_path / "deeper" / "x" / "b"), "-o",
                   str(tmp_path / "two.wasm"))[0] == 0
    assert (tmp_path / "one.wasm").read_bytes() == (tmp_path / "two.wasm").read_bytes()


def test_build_reports_compiler_errors(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "broken"
    d.mkdir()
    (d / "filter.c").write_text('#include "sluice_filter.h"\nint oops(void) { return nope; }\n')
    code, _, err = run_cli(capsys, "filter", "build", str(d))
    assert code == 1
    assert "nope" in err
    code, _, err = run_cli(capsys, "filter", "build", str(tmp_path))
    assert code == 1 and "no filter.c, filter.zig, filter.rs, filter.ts" in err


def test_new_refuses_bad_names_and_existing_dirs(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capsys, "filter", "new", "Bad Name", "--dir", str(tmp_path))[0] == 2
    (tmp_path / "taken").mkdir()
    code, _, err = run_cli(capsys, "filter", "new", "taken", "--dir", str(tmp_path))
    assert code == 2 and "already exists" in err


def test_test_with_builtin_pii_mask(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text(
        json.dumps({"topic": "users", "value": '{"email": "ann@example.com", "n": 1}'}) + "\n"
        + json.dumps({"topic": "users", "value": "nothing to see"}) + "\n"
        + json.dumps({"topic": "other", "value": "card 4111 1111 1111 1111"}) + "\n")
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"detectors": {"card": {"keep_last": 4}}}))
    code, out, err = run_cli(capsys, "filter", "test", "builtin:pii-mask", "--input", str(inp),
                             "--config", str(cfg))
    assert code == 0, err
    assert '"{\\"email\\": \\"***@*******.***\\", \\"n\\": 1}"' in out
    assert "line 2 users/0: KEEP" in out
    assert '"card **** **** **** 1111"' in out
    assert "counters: card=1, email=1" in out


def test_test_shows_filter_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"value": "x"}) + "\n")
    inplace = Path(__file__).resolve().parents[3] / "filters" / "examples" / "inplace-enrich"
    code, out, _ = run_cli(capsys, "filter", "test", str(inplace / "inplace-enrich.wasm"),
                           "--input", str(inp))
    assert code == 0
    assert "line 1 test/0: ERROR    filter failed:" in out
    assert "summary: error 1" in out


@pytest.mark.parametrize(("content", "message"), [
    ("{not json}\n", "line 1: not JSON"),
    ('{"value": 5}\n', "line 1: value must be null, a string"),
    ('{"value": {"base64": "!!"}}\n', "line 1: value: bad base64"),
    ('{"value": "x", "headers": [["a"]]}\n', "line 1: each header must be [name, value]"),
    ('\n{"topic": ""}\n', "line 2: topic must be a non-empty string"),
])
def test_test_input_errors_name_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         content: str, message: str) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text(content)
    code, _, err = run_cli(capsys, "filter", "test", "builtin:pii-mask", "--input", str(inp))
    assert code == 2
    assert message in err


def test_test_unknown_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text("{}\n")
    code, _, err = run_cli(capsys, "filter", "test", str(tmp_path / "missing.wasm"), "--input",
                           str(inp))
    assert code == 1 and "cannot read module" in err


@pytest.mark.parametrize(("lang", "variable", "install"), [
    ("rust", "SLUICE_RUSTC", "apt-get install rustc libstd-rust-dev-wasm32"),
    ("assemblyscript", "SLUICE_ASC", "bash scripts/dev.sh install"),
    ("go", "SLUICE_GO", "GOTOOLCHAIN=go1.26.8 go version"),
    ("js", "SLUICE_QUICKJS", "bash scripts/dev.sh install"),
    ("python", "SLUICE_COMPONENTIZE_PY", "bash scripts/dev.sh install"),
])
def test_build_names_the_missing_toolchain_and_its_install_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        lang: str, variable: str, install: str) -> None:
    assert run_cli(capsys, "filter", "new", "x", "--lang", lang, "--dir", str(tmp_path))[0] == 0
    monkeypatch.setenv(variable, str(tmp_path / "no-such-compiler"))
    code, out, err = run_cli(capsys, "filter", "build", str(tmp_path / "x"))
    assert code == 1 and out == ""
    assert install in err and "Traceback" not in err
    assert not (tmp_path / "x" / "x.wasm").exists()


def test_build_of_a_crate_names_the_missing_fetching_cargo(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    crate = Path(__file__).resolve().parents[3] / "filters" / "examples" / "seed000-rust"
    d = tmp_path / "crate"
    d.mkdir()
    for name in ("Cargo.toml", "Cargo.lock"):
        (d / name).write_text((crate / name).read_text())
    (d / "src").mkdir()
    (d / "src" / "lib.rs").write_text((crate / "src" / "lib.rs").read_text())
    monkeypatch.setenv("SLUICE_CARGO_FETCH", str(tmp_path / "no-such-cargo"))
    code, out, err = run_cli(capsys, "filter", "build", str(d))
    assert code == 1 and out == ""
    assert "rustup toolchain install stable" in err and "Traceback" not in err
    (d / "Cargo.lock").unlink()
    code, _, err = run_cli(capsys, "filter", "build", str(d))
    assert code == 1 and "no Cargo.lock" in err
