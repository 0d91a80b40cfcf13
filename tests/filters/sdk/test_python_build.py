"""What `sluice filter build` makes of a Python filter: a component holding the filter, the SDK
and CPython's standard library, nothing of the machine that builds it; with the admin export
(world sluice-filter-admin) only for a filter.py that registers `on_admin`."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sluice.filters import build as build_module
from sluice.filters.abi_base import FilterLoadError
from sluice.filters.admin import AdminResource, AdminVerdict
from sluice.filters.build import BuildError, build_filter
from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.decisions import Action
from sluice.filters.runtime import load_filter

MARKER = "sluice_builder_only_marker"
EXAMPLES = Path(__file__).resolve().parents[3] / "filters" / "examples"


def test_the_builders_site_packages_are_not_bundled(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """componentize-py appends a site-packages to the guest's path: $VIRTUAL_ENV's, else the
    one that `python3` on $PATH names. A package that only the builder's python3 has must not
    end up in the module (it used to: the build walked and mounted that whole directory)."""
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / f"{MARKER}.py").write_text("VALUE = 1\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    # What `python3 -c 'import site; ...'` prints for componentize-py: the site directories.
    fake.write_text(f"#!/bin/sh\necho '{site}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)

    src = tmp_path / "filt"
    src.mkdir()
    (src / "filter.py").write_text(
        f"import {MARKER}  # noqa: F401\n"
        "import sluice_filter as sluice\n\n\n"
        "@sluice.on_record\n"
        "def f(rec):\n"
        "    return sluice.keep()\n")
    with pytest.raises(BuildError, match=f"No module named '{MARKER}'"):
        build_filter(src, tmp_path / "out.wasm")


def _build_in_new_process(source: Path, out: Path, env: dict[str, str] | None = None) -> str:
    code = ("import sys; from pathlib import Path; from sluice.filters.build import build_filter;"
            " build_filter(Path(sys.argv[1]), Path(sys.argv[2]))")
    proc = subprocess.run([sys.executable, "-c", code, str(source), str(out)],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return hashlib.sha256(out.read_bytes()).hexdigest()


def test_a_python_filter_builds_the_committed_bytes_wherever_it_is_built(tmp_path: Path) -> None:
    """componentize-py snapshots a running CPython: host randomness, clocks, file times, inode
    and device numbers used to land in the module. One build, in a new process, meets each of
    those at once and must still give the committed bytes (tests/filters/builtin/
    test_build_check.py builds the example where it lies, in another process):
    - from a copy of the sources in another directory;
    - next to a tmpfs held by another namespace, which takes the device number the build's
      tmpfs gets on a quiet machine (the one the committed module was built with);
    - with a componentize-py whose virtualenv is under /tmp, which the build covers with a
      tmpfs of its own."""
    import componentize_py

    copy = tmp_path / "elsewhere" / "upper-py"
    copy.mkdir(parents=True)
    (copy / "filter.py").write_bytes((EXAMPLES / "upper-py" / "filter.py").read_bytes())
    unshare = build_module.check_py_sandbox()
    (tmp_path / "held").mkdir()
    venv = Path(tempfile.mkdtemp(prefix="sluice-venv-", dir="/tmp"))
    holder = subprocess.Popen(
        [unshare, "--user", "--map-root-user", "--mount", "sh", "-c",
         'mount -t tmpfs sluice-held "$1" && echo mounted && exec sleep 600', "sh",
         str(tmp_path / "held")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "mounted"
        base = Path(getattr(sys, "_base_executable", sys.executable))
        subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next((venv / "lib").glob("python3*/site-packages"))
        shutil.copytree(Path(componentize_py.__file__).parent, site / "componentize_py")
        tool = venv / "bin" / "componentize-py"
        tool.write_text(f"#!{venv}/bin/python\nimport sys\nfrom componentize_py import script\n"
                        "sys.exit(script())\n")
        tool.chmod(0o755)
        env = {**os.environ, "SLUICE_COMPONENTIZE_PY": str(tool)}
        got = _build_in_new_process(copy, tmp_path / "a.wasm", env)
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(venv)
    committed = hashlib.sha256((EXAMPLES / "upper-py" / "upper-py.wasm").read_bytes()).hexdigest()
    assert got == committed


_STAT_PROBE = """\
import ctypes, os, sys
st = os.stat(sys.argv[1])  # newfstatat
buf = ctypes.create_string_buffer(256)
libc = ctypes.CDLL(None, use_errno=True)
assert libc.statx(-100, sys.argv[1].encode(), 0, 0xFFF, buf) == 0, ctypes.get_errno()
major = int.from_bytes(buf.raw[136:140], "little")  # stx_dev_major
minor = int.from_bytes(buf.raw[140:144], "little")  # stx_dev_minor
print(st.st_dev, os.makedev(major, minor))
"""


def test_the_shim_reports_one_device_number_for_every_build_tmpfs(tmp_path: Path) -> None:
    """The kernel gives each new tmpfs the lowest free anonymous device number, so a build's
    tmpfs gets another one while other mounts exist (concurrent builds on a loaded machine);
    wasmtime hashes it with the inode into the guest's inode numbers, which land in the heap.
    Under the shim, statx and newfstatat report one fixed device for the build's tmpfs."""
    unshare = build_module.check_py_sandbox()
    shim = build_module.py_shim()
    (tmp_path / "probe.py").write_text(_STAT_PROBE)
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    script = (
        'set -eu\n'
        'mount -t tmpfs sluice-a "$1/a"; mount -t tmpfs sluice-b "$1/b"\n'
        'touch "$1/a/f" "$1/b/f"\n'
        'stat -c %d "$1/a/f" "$1/b/f"\n'
        'for d in a b; do\n'
        '  env LD_PRELOAD="$2" SLUICE_REPRO_SEED="$3" SOURCE_DATE_EPOCH=315532800 \\\n'
        '    SLUICE_REPRO_ROOT="$1/$d" "$4" -S "$1/probe.py" "$1/$d/f"\n'
        'done\n')
    proc = subprocess.run([unshare, "--user", "--map-root-user", "--mount", "sh", "-c", script,
                           "sh", str(tmp_path), str(shim), "0" * 64, sys.executable],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    real_a, real_b, shim_a, shim_b = proc.stdout.split("\n")[:4]
    assert real_a != real_b  # two mounts: two device numbers from the kernel
    assert len(set(shim_a.split())) == 1  # statx and newfstatat agree
    assert shim_a == shim_b
    assert shim_a.split()[0] not in (real_a, real_b)


def test_the_random_stream_of_a_build_follows_its_sources(tmp_path: Path) -> None:
    """The build's fake randomness (CPython's hash secret) is keyed by the sources' digest."""
    (tmp_path / "filter.py").write_text((EXAMPLES / "upper-py" / "filter.py").read_text())
    before = build_module.py_sources_digest(tmp_path)
    assert before == build_module.py_sources_digest(EXAMPLES / "upper-py")
    (tmp_path / "filter.py").write_text("# edited\n" + (tmp_path / "filter.py").read_text())
    assert build_module.py_sources_digest(tmp_path) != before


def test_without_unshare_a_python_build_says_what_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build_module, "_sandbox_ok", False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(BuildError, match=r"`unshare` is not on PATH.*util-linux"):
        build_filter(EXAMPLES / "upper-py", tmp_path / "out.wasm")


def test_a_refused_namespace_fails_the_build_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build_module, "_sandbox_ok", False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "unshare"
    # What util-linux prints where user namespaces are switched off.
    fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(BuildError, match=r"unshare failed: Operation not permitted.*"
                                         r"user namespaces"):
        build_filter(EXAMPLES / "upper-py", tmp_path / "out.wasm")


POLICY = """
import sluice_filter as sluice


@sluice.on_record
def upper(rec):
    return rec.with_value(rec.value.upper()) if rec.value else None


@sluice.on_admin
def policy(req):
    if req["op"] != "create_topics":
        return sluice.allow()
    retention = (req["configs"] or {}).get("retention.ms")
    if retention is None or int(retention) < 3600000:
        return sluice.deny(f"retention.ms must be at least 3600000, not {retention}")
    if req["name"] == "explode":
        raise ValueError("asked to fail")
    if req["partitions"] > 12:
        return {"decision": "rewrite", "message": "capped", "partitions": 12}
    return None
"""


def test_a_python_admin_function_answers_each_resource(tmp_path: Path) -> None:
    src = tmp_path / "policy"
    src.mkdir()
    (src / "filter.py").write_text(POLICY)
    module = build_filter(src, tmp_path / "policy.wasm")
    f = load_filter(FilterSpec(name="p", module=str(module),
                               apply_to=frozenset({"produce", "admin"})),
                    cache_dir=tmp_path / "cache")
    assert "admin" in f.capabilities and f.supports_admin

    def ask(name: str, partitions: int, configs: dict[str, str | None]) -> AdminVerdict:
        return f.run_admin(AdminResource("create_topics", name, partitions=partitions,
                                         replication_factor=1, configs=configs))

    short = ask("t.short", 1, {"retention.ms": "1000"})
    assert (short.decision, short.message) == (
        "deny", "retention.ms must be at least 3600000, not 1000")
    assert ask("t.ok", 2, {"retention.ms": "7200000"}).decision == "allow"
    capped = ask("t.big", 50, {"retention.ms": "7200000"})
    assert (capped.decision, capped.partitions) == ("rewrite", 12)
    failed = ask("explode", 1, {"retention.ms": "7200000"})
    assert failed.decision == "deny"
    assert "ValueError: asked to fail" in (failed.failure or "")
    ctx = RecordContext(topic="t", partition=0, direction="produce", client_id="c")
    res = f.run_batch(ctx, [FilterRecord(0, 0, None, b"abc", [])])
    assert res.decisions[0].action == Action.REWRITE and res.decisions[0].value == b"ABC"


def test_a_python_record_filter_has_no_admin_export() -> None:
    module = EXAMPLES / "upper-py" / "upper-py.wasm"
    assert "admin" not in load_filter(FilterSpec(name="u", module=str(module))).capabilities
    with pytest.raises(FilterLoadError, match="does not export admin"):
        load_filter(FilterSpec(name="u", module=str(module), apply_to=frozenset({"admin"})))
