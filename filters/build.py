"""Build the Wasm filters in this repository (and users' filter directories) reproducibly.

A filter directory holds one entry source and builds to one stripped Wasm module:

- ``filter.c`` (C, freestanding, with ``sluice_filter.h``) and ``filter.zig`` (Zig, with the
  ``sluice`` module): the ``ziglang`` wheel's compiler;
- ``filter.rs`` (Rust, with the ``sluice`` crate, ``sdk/rust/sluice.rs``): a ``rustc`` that has
  the ``wasm32-unknown-unknown`` standard library (Debian's ``rustc`` +
  ``libstd-rust-dev-wasm32``);
- ``filter.ts`` (AssemblyScript, with the ``sluice`` module, ``sdk/assemblyscript/``): the
  pinned ``assemblyscript`` compiler that ``scripts/dev.sh install`` puts in the virtualenv;
- ``filter.go`` (Go, with the ``sluice`` package, ``sdk/go/``): the standard Go toolchain
  (``GOOS=wasip1 GOARCH=wasm``, a ``c-shared`` WASI reactor), offline: the SDK is the only
  module and it comes from this repository;
- ``filter.js`` (JavaScript, with the ``sluice`` module, ``sdk/js/``): the QuickJS-ng engine's
  C sources (pinned, fetched by ``scripts/dev.sh install``) compiled once per machine for
  wasm32-wasi by the ``ziglang`` wheel, linked with the C shim ``sdk/js/sluice_js.c`` and the
  filter's source embedded as data;
- ``filter.py`` (Python, with the ``sluice_filter`` package, ``sdk/python/``): the pinned
  ``componentize-py`` that ``scripts/dev.sh install`` puts in the virtualenv bundles CPython
  and the filter into a WebAssembly component (world ``sdk/python/wit``) with every WASI
  import replaced by a trapping stub (``--stub-wasi``); it runs in a private mount namespace
  (``unshare``) on a fresh tmpfs with ``sdk/python/reproducible_shim.c`` preloaded, so that
  the pre-initialised snapshot holds no host randomness, clock, file time, inode number or
  device number (the kernel numbers each tmpfs by the other mounts that exist: the shim reports
  a fixed one);
- ``Cargo.toml`` (a Rust crate with a committed ``Cargo.lock``, crates from crates.io): the
  locked crates vendored by a cargo that reads the sparse index, then Debian's ``cargo`` and
  ``rustc`` build ``--release --target wasm32-unknown-unknown`` offline.

The output depends only on the sources and the compiler versions, not on the directory it is
built from.

Repository targets:
  filters/src/NAME/       -> filters/builtin/NAME.wasm   (the ``builtin:NAME`` modules)
  filters/examples/NAME/  -> filters/examples/NAME/NAME.wasm

Usage:
  python filters/build.py            build every target in place
  python filters/build.py --check    rebuild into a temporary directory; exit 1 if any
                                     committed .wasm differs or is missing
  python filters/build.py --list     print the targets

This file is also imported by ``sluice filter build`` (``build_filter``); it uses only the
standard library so that it runs as a plain script too.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

FILTERS_DIR = Path(__file__).resolve().parent
SDK_DIR = FILTERS_DIR / "sdk"
SRC_DIR = FILTERS_DIR / "src"
BUILTIN_DIR = FILTERS_DIR / "builtin"
EXAMPLES_DIR = FILTERS_DIR / "examples"

# The compiler version the committed modules were built with; another version may emit other
# bytes, so --check refuses to compare across versions.
ZIG_VERSION = "0.17.0"

# -O2 rather than -Oz: on builtin:pii-mask it ran ~1.6x faster for ~1.5x the bytes (47 KB),
# and filters sit on the proxy's hot path.
C_FLAGS = (
    "--target=wasm32-freestanding",
    "-O2",
    "-s",
    "-nostdlib",
    "-mbulk-memory",
    "-Wall",
    "-Wextra",
    "-Wno-unused-function",
    "-Wno-unused-parameter",
    "-Wl,--no-entry",
    "-Wl,--export-dynamic",
)

# Rust: Debian's rustc (bookworm: 1.63) with the wasm32-unknown-unknown standard library. The
# SDK crate is compiled next to the filter on every build (it is one file), so nothing but rustc
# is needed and nothing is fetched.
RUST_VERSION = "1.63.0"
RUST_TARGET = "wasm32-unknown-unknown"
RUST_FLAGS = (
    "--edition", "2021",
    "--target", RUST_TARGET,
    "-C", "opt-level=3",
    "-C", "codegen-units=1",
    "-C", "metadata=sluice",
)
RUST_INSTALL = (
    "install Debian's with `apt-get install rustc libstd-rust-dev-wasm32` (bash scripts/dev.sh "
    "install does), or `rustup target add wasm32-unknown-unknown`"
)
RUST_MISSING = (
    "no Rust compiler with the wasm32-unknown-unknown standard library was found: "
    f"{RUST_INSTALL}; SLUICE_RUSTC=/path/to/rustc picks one"
)

# AssemblyScript: the npm package pinned in sdk/assemblyscript/toolchain (package-lock.json),
# installed by scripts/dev.sh into the virtualenv's node/ directory. The minimal runtime's
# garbage collector only runs when the SDK asks (once per call, before the input arrives).
ASC_VERSION = "0.28.20"
ASC_FLAGS = ("--runtime", "minimal", "-O3", "--noAssert", "--use", "abort=")
ASC_MISSING = (
    f"the AssemblyScript compiler (assemblyscript@{ASC_VERSION}) is not installed: run "
    "`bash scripts/dev.sh install`, or `npm ci --prefix {prefix}` with a copy of "
    "filters/sdk/assemblyscript/toolchain/package.json and package-lock.json in {prefix} "
    "(it needs Node.js 20+: `apt-get install nodejs npm`); SLUICE_ASC=/path/to/asc picks one"
)

# Go: the standard toolchain. A filter is package main in one file; the build copies it into a
# temporary module whose go.mod points `sluice` at sdk/go, so that nothing is fetched, and
# -trimpath, -buildvcs=false and an empty build id keep every path and stamp of this machine
# out of the module.
GO_VERSION = "1.26.8"
GO_FLAGS = (
    "-trimpath",
    "-buildvcs=false",
    "-buildmode=c-shared",
    "-ldflags=-s -w -buildid=",
)
GO_ENV = {
    "GOOS": "wasip1",
    "GOARCH": "wasm",
    "CGO_ENABLED": "0",
    "GOWORK": "off",
    "GOFLAGS": "-mod=mod",
    "GOTOOLCHAIN": "local",
    "GO111MODULE": "on",
    "GOPROXY": "off",
}
GO_MISSING = (
    f"the Go toolchain (go{GO_VERSION}; 1.24 or newer for //go:wasmexport) is not installed: "
    f"with any Go 1.21 or newer on PATH, `GOTOOLCHAIN=go{GO_VERSION} go version` fetches it "
    "from the Go module proxy (then use that toolchain's bin/go, or keep GOTOOLCHAIN set); "
    "or unpack the Go project's release archive into /usr/local/go (Debian's golang-go is too "
    "old); SLUICE_GO=/path/to/go picks one"
)

# Cargo crates (a directory with Cargo.toml and a committed Cargo.lock, e.g. seed 000's example
# with serde_json and chrono): `cargo vendor --locked` (a cargo that speaks crates.io's sparse
# index: rustup's, 1.68 or newer) copies the pinned crates into a temporary directory, checked
# against the lock file's sha256 sums; then Debian's cargo and rustc (the only ones here with
# the wasm32-unknown-unknown standard library) build offline from it. Paths are remapped so
# that the module does not depend on where anything lives.
CARGO_BUILD_MISSING = (
    "no Debian cargo to build the crate with: install it with `apt-get install cargo rustc "
    "libstd-rust-dev-wasm32` (bash scripts/dev.sh install does); SLUICE_CARGO picks one"
)
CARGO_FETCH_MISSING = (
    "no cargo that can fetch crates from crates.io (1.68 or newer: the sparse index) was found: "
    "install rustup's (`rustup toolchain install stable`), or set SLUICE_CARGO_FETCH"
)

# JavaScript: QuickJS-ng's C sources as the PyPI sdist `quickjs-ng` bundles them (pinned by
# version and sha256 in scripts/dev.sh, which unpacks them into the virtualenv), compiled for
# wasm32-wasi (wasi-libc: QuickJS needs malloc and libm) as a reactor, so that wasi-libc's
# constructors run in `_initialize`. The engine's objects depend only on the sources, the
# compiler and these flags: they are compiled once per machine into a cache keyed by all
# three, and each filter links them with the shim and its own embedded source.
QUICKJS_VERSION = "0.17.0"
QUICKJS_SDIST = "quickjs-ng==0.17.0.2"
QUICKJS_SOURCES = ("dtoa.c", "libregexp.c", "libunicode.c", "quickjs.c")
JS_ENGINE_FLAGS = (
    "--target=wasm32-wasi",
    "-O2",
    "-mbulk-memory",
    "-funsigned-char",  # as QuickJS-ng's own build: its code assumes an unsigned char
    "-fwrapv",
    "-w",
)
JS_FLAGS = (
    "--target=wasm32-wasi",
    "-mexec-model=reactor",
    "-O2",
    "-s",
    "-mbulk-memory",
    "-funsigned-char",
    "-Wall",
    "-Wextra",
    "-Wno-unused-function",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
    # QuickJS's own stack check (JS_SetMaxStackSize in the shim) stays under this, so deep
    # recursion never writes below the stack (the host's Wasm stack limit usually traps first).
    "-Wl,-z,stack-size=1048576",
)
JS_MISSING = (
    f"the QuickJS-ng sources (version {QUICKJS_VERSION}, from the PyPI sdist "
    f"{QUICKJS_SDIST}) are not installed: run `bash scripts/dev.sh install`, which fetches "
    "and checks them; SLUICE_QUICKJS=/path/to/the/sources picks a directory holding "
    "quickjs.c and quickjs.h"
)

ENTRIES = ("filter.c", "filter.zig", "filter.rs", "filter.ts", "filter.go", "filter.js",
           "filter.py", "Cargo.toml")

ZIG_FLAGS = (
    "-target",
    "wasm32-freestanding",
    "-mcpu",
    "generic+bulk_memory",
    "-fno-entry",
    "-rdynamic",
    "-O",
    "ReleaseSmall",
    "-fstrip",
)


class BuildError(RuntimeError):
    """The compiler failed or is missing; the message carries its output."""


@dataclass(frozen=True)
class Target:
    """One filter directory and the module it builds to."""

    name: str
    source_dir: Path
    output: Path


def entry_source(source_dir: Path) -> Path:
    """The entry file of a filter directory: filter.c, .zig, .rs, .ts, .go, .js or a Cargo.toml
    (exactly one)."""
    found = [source_dir / name for name in ENTRIES if (source_dir / name).is_file()]
    if not found:
        raise BuildError(f"{source_dir}: no {', '.join(ENTRIES)}")
    if len(found) > 1:
        raise BuildError(f"{source_dir}: {' and '.join(p.name for p in found)}; keep one")
    return found[0]


def _zig() -> list[str]:
    return [sys.executable, "-m", "ziglang"]


def zig_version() -> str:
    """Version of the ziglang wheel installed in this interpreter."""
    try:
        out = subprocess.run([*_zig(), "version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(
            "the ziglang compiler is not installed: pip install 'ziglang==" + ZIG_VERSION + "'"
        ) from exc
    return out.stdout.strip()


def _rust_has_wasm_std(rustc: str) -> bool:
    try:
        out = subprocess.run([rustc, "--print", "target-libdir", "--target", RUST_TARGET],
                             capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return False
    libdir = Path(out.stdout.strip())
    return libdir.is_dir() and any(libdir.glob("libstd-*.rlib"))


def find_rustc() -> str:
    """A rustc that can build for wasm32-unknown-unknown: $SLUICE_RUSTC, Debian's, or PATH's.

    Debian's comes before PATH's because a rustup toolchain on PATH often lacks the wasm32
    target while Debian's libstd-rust-dev-wasm32 provides it.
    """
    chosen = os.environ.get("SLUICE_RUSTC")
    if chosen:
        if _rust_has_wasm_std(chosen):
            return chosen
        raise BuildError(f"SLUICE_RUSTC={chosen} cannot build for {RUST_TARGET} (missing, or "
                         f"without its standard library): {RUST_INSTALL}, or unset SLUICE_RUSTC")
    for rustc in ("/usr/bin/rustc", shutil.which("rustc")):
        if rustc and _rust_has_wasm_std(rustc):
            return rustc
    raise BuildError(RUST_MISSING)


def rustc_version(rustc: str) -> str:
    out = subprocess.run([rustc, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


def asc_prefix() -> Path:
    """Where scripts/dev.sh installs the AssemblyScript toolchain: the virtualenv's node/."""
    return Path(sys.prefix) / "node"


def find_asc() -> list[str]:
    """The command that runs the pinned AssemblyScript compiler."""
    node = shutil.which("node")
    env_asc = os.environ.get("SLUICE_ASC")
    local = asc_prefix() / "node_modules" / "assemblyscript" / "bin" / "asc.js"
    if env_asc:
        if not os.access(env_asc, os.X_OK):
            raise BuildError(f"SLUICE_ASC={env_asc} is not an executable; unset it, or "
                             + ASC_MISSING.format(prefix=asc_prefix()))
        return [env_asc]
    if node and local.is_file():
        return [node, str(local)]
    on_path = shutil.which("asc")
    if node and on_path:
        return [on_path]
    raise BuildError(ASC_MISSING.format(prefix=asc_prefix()))


def asc_version(asc: list[str]) -> str:
    out = subprocess.run([*asc, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip().split()[-1]


def find_go() -> str:
    """The go command: $SLUICE_GO, the virtualenv's (scripts/dev.sh), PATH's, or the release
    archive's usual place."""
    chosen = os.environ.get("SLUICE_GO")
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise BuildError(f"SLUICE_GO={chosen} is not an executable; unset it, or "
                             + GO_MISSING)
        return chosen
    venv_go = str(Path(sys.prefix) / "bin" / "go")  # scripts/dev.sh links the pinned one here
    for go in (venv_go, shutil.which("go"), "/usr/local/go/bin/go"):
        if go and os.access(go, os.X_OK):
            return go
    raise BuildError(GO_MISSING)


def go_version(go: str) -> str:
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True,
                         env={**os.environ, "GOTOOLCHAIN": "local"})
    return out.stdout.strip().removeprefix("go")


def _cargo_version(cargo: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([cargo, "--version"], capture_output=True, text=True, check=True,
                             env={**os.environ, "RUSTC": ""})
        major, minor = out.stdout.split()[1].split(".")[:2]
        return int(major), int(minor)
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        return None


def find_fetch_cargo() -> str:
    """A cargo that reads crates.io's sparse index: $SLUICE_CARGO_FETCH, rustup's, PATH's."""
    chosen = os.environ.get("SLUICE_CARGO_FETCH")
    candidates = [chosen] if chosen else [str(Path.home() / ".cargo" / "bin" / "cargo"),
                                          shutil.which("cargo")]
    for cargo in candidates:
        if cargo and os.access(cargo, os.X_OK) and (_cargo_version(cargo) or (0, 0)) >= (1, 68):
            return cargo
    raise BuildError(CARGO_FETCH_MISSING)


def find_build_cargo() -> str:
    """The cargo that goes with find_rustc()'s rustc: $SLUICE_CARGO or Debian's."""
    for cargo in (os.environ.get("SLUICE_CARGO"), "/usr/bin/cargo"):
        if cargo and os.access(cargo, os.X_OK):
            return cargo
    raise BuildError(CARGO_BUILD_MISSING)


def _cargo_steps(source_dir: Path, tmp: Path,
                 tmp_out: Path) -> tuple[list[tuple[list[str], Path]], dict[str, str]]:
    """Vendor the locked crates, then build offline; returns the steps and their environment."""
    if not (source_dir / "Cargo.lock").is_file():
        raise BuildError(f"{source_dir}: no Cargo.lock; run `cargo generate-lockfile` and "
                         "commit it (the build only uses locked versions)")
    rustc = find_rustc()
    vendor, home, target = tmp / "vendor", tmp / "cargo-home", tmp / "target"
    home.mkdir()
    (home / "config.toml").write_text(
        '[source.crates-io]\nreplace-with = "vendored"\n\n'
        f'[source.vendored]\ndirectory = "{vendor}"\n')
    remap = " ".join([f"--remap-path-prefix={vendor}=/cargo/vendor",
                      f"--remap-path-prefix={source_dir}=/cargo/src",
                      f"--remap-path-prefix={home}=/cargo/home"])
    env = {"CARGO_HOME": str(home), "CARGO_TARGET_DIR": str(target), "RUSTC": rustc,
           "RUSTFLAGS": remap, "CARGO_INCREMENTAL": "0", "RUSTC_WRAPPER": ""}
    fetch = [find_fetch_cargo(), "vendor", "--locked", "--versioned-dirs", "--quiet",
             str(vendor)]
    build = [find_build_cargo(), "build", "--offline", "--locked", "--release", "--quiet",
             "--target", RUST_TARGET]
    return [(fetch, source_dir), (build, source_dir)], env


def _cargo_output(source_dir: Path, tmp: Path) -> Path:
    """The cdylib cargo wrote: target/wasm32-unknown-unknown/release/<lib name>.wasm."""
    found = sorted((tmp / "target" / RUST_TARGET / "release").glob("*.wasm"))
    if len(found) != 1:
        raise BuildError(f"{source_dir}: expected one cdylib .wasm, cargo wrote "
                         f"{[p.name for p in found]} (crate-type = [\"cdylib\"] in Cargo.toml)")
    return found[0]


_GO_MOD = """module filter

go 1.24

require sluice v0.0.0

replace sluice => ./sluice
"""


def _go_command(entry: Path, tmp: Path, tmp_out: Path) -> tuple[list[str], Path]:
    """The go build command and the directory it runs in: a module holding only the filter."""
    module = tmp / "module"
    module.mkdir()
    shutil.copyfile(entry, module / "filter.go")
    # A copy of the SDK inside the module, named relatively: the replace directive's path is
    # recorded in the module's build info, and an absolute one would differ per checkout.
    shutil.copytree(SDK_DIR / "go", module / "sluice")
    (module / "go.mod").write_text(_GO_MOD)
    return [find_go(), "build", *GO_FLAGS, "-o", str(tmp_out), "."], module


COMPONENTIZE_PY_VERSION = "0.25.1"
PY_WORLD = "sluice-filter"
# The world with the admin export, for a filter.py that registers an admin function (a mention
# in a comment counts too: its admin calls then fail with "does not handle admin requests").
PY_ADMIN_WORLD = "sluice-filter-admin"
_PY_ON_ADMIN = re.compile(r"\bon_admin\b")


def find_componentize_py() -> str:
    """The componentize-py of this interpreter's environment (scripts/dev.sh installs it);
    ``SLUICE_COMPONENTIZE_PY`` names another."""
    here = Path(sys.executable).parent / "componentize-py"
    chosen = os.environ.get("SLUICE_COMPONENTIZE_PY")
    candidates = [chosen] if chosen else [str(here), shutil.which("componentize-py")]
    for cand in candidates:
        if cand and Path(cand).is_file():
            return cand
    raise BuildError(
        "componentize-py is not installed (it builds Python filters): run "
        "`bash scripts/dev.sh install`, or pip install 'componentize-py=="
        + COMPONENTIZE_PY_VERSION + "'")


def componentize_py_version(tool: str) -> str:
    out = subprocess.run([tool, "--version"], capture_output=True, text=True)
    return out.stdout.strip().removeprefix("componentize-py").strip()


# Python builds are made reproducible (componentize-py snapshots a running CPython, so
# whatever the host hands it while it starts ends up in the module): componentize-py runs in a
# private mount namespace, on a fresh tmpfs that holds everything the guest sees, created in a
# fixed order (tmpfs numbers inodes per superblock, from 2, since Linux 5.9; wasmtime reads
# them with direct system calls, and they land in the heap), with every file time clamped to
# PY_SOURCE_DATE_EPOCH, and with sdk/python/reproducible_shim.c preloaded, which replaces the
# host's randomness and clocks by values derived from the sha256 of the build's inputs, and the
# tmpfs's device number (the lowest free one when it is mounted: it moves with the other mounts
# on a busy machine, and wasmtime hashes it into the guest's inode numbers) by a fixed one.
PY_SOURCE_DATE_EPOCH = 315532800  # 1980-01-01T00:00:00Z
PY_SANDBOX_ROOT = "/tmp"  # where the tmpfs is bound inside the namespace: fixed guest paths
PY_SHIM_SOURCE = SDK_DIR / "python" / "reproducible_shim.c"
PY_SHIM_FLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra")
UNSHARE_MISSING = (
    "Python filters are built in a private mount namespace with a fresh tmpfs, and {why}: "
    "install util-linux's `unshare` (`apt-get install util-linux`) and allow unprivileged "
    "user namespaces (sysctl kernel.unprivileged_userns_clone=1, or "
    "user.max_user_namespaces > 0), or build as root"
)
_sandbox_ok: bool = False


def check_py_sandbox() -> str:
    """The unshare command; fails with a clear message unless `unshare --user --map-root-user
    --mount` works here and mounts a tmpfs (what a Python build needs)."""
    global _sandbox_ok
    unshare = shutil.which("unshare")
    if unshare and _sandbox_ok:
        return unshare
    if not unshare:
        raise BuildError(UNSHARE_MISSING.format(why="`unshare` is not on PATH"))
    with tempfile.TemporaryDirectory(prefix="sluice-probe-") as d:
        try:
            proc = subprocess.run(
                [unshare, "--user", "--map-root-user", "--mount", "sh", "-c",
                 'mount -t tmpfs sluice-probe "$1" && touch "$1/a" && stat -c %i "$1/a"',
                 "sh", d], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildError(UNSHARE_MISSING.format(why=f"running unshare failed: {exc}")) from exc
    if proc.returncode != 0 or proc.stdout.strip() != "2":
        why = (proc.stderr.strip() or proc.stdout.strip()
               or f"exit status {proc.returncode}")
        raise BuildError(UNSHARE_MISSING.format(
            why=f"`unshare --user --map-root-user --mount` with a tmpfs failed here ({why})"))
    _sandbox_ok = True
    return unshare


def _shim_compiler() -> list[str]:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc:
        return [cc]
    return [*_zig(), "cc"]  # glibc target of this machine: what componentize-py links to


def py_shim() -> Path:
    """sdk/python/reproducible_shim.c compiled to a shared object for LD_PRELOAD, cached per
    machine, keyed by the source, the compiler and the flags."""
    cc = _shim_compiler()
    try:
        ver = subprocess.run([*cc, "--version"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(f"no C compiler for {PY_SHIM_SOURCE.name} (cc, or the ziglang "
                         f"wheel): apt-get install gcc, or bash scripts/dev.sh install") from exc
    key = hashlib.sha256("\0".join([*cc, ver, *PY_SHIM_FLAGS]).encode()
                         + PY_SHIM_SOURCE.read_bytes()).hexdigest()[:24]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    out = Path(base) / "sluice" / "python-shim" / key / "reproducible_shim.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".build-{os.getpid()}.so")
    proc = subprocess.run([*cc, *PY_SHIM_FLAGS, str(PY_SHIM_SOURCE), "-o", str(staging)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        staging.unlink(missing_ok=True)
        raise BuildError(f"{PY_SHIM_SOURCE}: compilation failed\n{proc.stderr.strip()}")
    staging.replace(out)
    return out


def _py_inputs(entry: Path) -> list[tuple[str, Path]]:
    """What goes into the guest's app directory: (path in it, source), sorted by path."""
    sdk = SDK_DIR / "python"
    files = [("filter.py", entry), ("sluice_app.py", sdk / "sluice_app.py")]
    files += [(f"sluice_filter/{p.name}", p) for p in (sdk / "sluice_filter").glob("*.py")]
    files += [(f"wit/{p.name}", p) for p in (sdk / "wit").glob("*.wit")]
    return sorted(files)


def _tool_venv(tool: str) -> tuple[Path, str] | None:
    """The virtualenv of a componentize-py entry-point script and its interpreter's name
    (from the script's ``#!`` line), or None when the tool is not a virtualenv's script."""
    try:
        with open(tool, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    interp = Path(first[2:].decode(errors="replace").strip().split(" ")[0])
    venv = interp.parent.parent
    if interp.parent.name != "bin" or not (venv / "pyvenv.cfg").is_file():
        return None
    return venv, interp.name


def _py_sandbox_script(
    tmp: Path, entry: Path, tool: str, shim: Path, seed: str, venv: tuple[Path, str] | None
) -> str:
    """The shell script run in the private mount namespace: tmpfs, copies in a fixed order,
    clamped times, then componentize-py with the shim preloaded."""
    q = shlex.quote
    box, root = tmp / "box", PY_SANDBOX_ROOT
    world = PY_ADMIN_WORLD if _PY_ON_ADMIN.search(entry.read_text()) else PY_WORLD
    lines = ["set -eu", f"mount -t tmpfs -o mode=0755 sluice-build {q(str(box))}",
             f"cd {q(str(box))}"]
    dirs = ["app", "app/sluice_filter", "app/wit", "home", "no-venv", "no-venv/lib",
            "no-venv/lib/site-packages", "out", "tmp", "tool"]
    lines += [f"mkdir {d}" for d in dirs]
    lines += [f"cp {q(str(src))} app/{rel}" for rel, src in _py_inputs(entry)]
    lines += [f"cp {q(str(shim))} shim.so"]
    lines += [f"find . -exec touch -h -d @{PY_SOURCE_DATE_EPOCH} {{}} +"]
    if venv is not None:
        # The builder's virtualenv (componentize-py's Python package), read-only at a fixed
        # place inside the box: a clone under /tmp would otherwise be hidden by the tmpfs.
        lines += [f"mount --bind {q(str(venv[0]))} tool",
                  "mount -o remount,bind,ro tool"]
        run = [f"{root}/tool/bin/{venv[1]}", f"{root}/tool/bin/{Path(tool).name}"]
    else:
        run = [tool]
    lines += [f"mount --rbind {q(str(box))} {root}", f"cd {root}/app"]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": f"{root}/home", "TMPDIR": f"{root}/tmp", "VIRTUAL_ENV": f"{root}/no-venv",
        "PYTHONDONTWRITEBYTECODE": "1", "TZ": "UTC", "LC_ALL": "C",
        "SOURCE_DATE_EPOCH": str(PY_SOURCE_DATE_EPOCH), "SLUICE_REPRO_SEED": seed,
        "LD_PRELOAD": f"{root}/shim.so", "SLUICE_REPRO_ROOT": root,
    }
    cmd = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *run, "-q", "-d", "wit",
           "-w", world, "componentize", "--stub-wasi", "-p", ".", "sluice_app",
           "-o", f"{root}/out/out.wasm"]
    lines += [" ".join(q(c) for c in cmd) + " >&2", "cd /", f"umount -R {root}",
              f"cp {q(str(box / 'out' / 'out.wasm'))} {q(str(tmp / 'out.wasm'))}"]
    return "\n".join(lines) + "\n"


def _py_command(entry: Path, tmp: Path, tmp_out: Path) -> tuple[list[str], Path]:
    """componentize-py, in a private mount namespace over a tmpfs holding only the filter, the
    SDK and the world (nothing of the builder's virtualenv or site-packages is bundled)."""
    unshare = check_py_sandbox()
    tool = str(Path(find_componentize_py()).resolve())
    shim = py_shim()
    venv = _tool_venv(tool)
    if venv is None and Path(tool).is_relative_to(PY_SANDBOX_ROOT):
        raise BuildError(f"{tool} is under {PY_SANDBOX_ROOT}, which the Python build hides "
                         "behind its own tmpfs, and is not a virtualenv's script: install "
                         "it elsewhere")
    if tmp_out != tmp / "out.wasm":
        raise BuildError("internal: the Python build writes tmp/out.wasm")
    (tmp / "box").mkdir()
    script = tmp / "sandbox.sh"
    script.write_text(_py_sandbox_script(tmp, entry, tool, shim,
                                         py_sources_digest(entry.parent), venv))
    return [unshare, "--user", "--map-root-user", "--mount", "sh", str(script)], tmp


def _compile_command(entry: Path, source_dir: Path, tmp: Path, tmp_out: Path) -> list[list[str]]:
    """The commands that compile `entry` (run in `source_dir`, paths relative to it)."""
    sdk = os.path.relpath(SDK_DIR, source_dir)
    if entry.suffix == ".c":
        return [[*_zig(), "cc", *C_FLAGS, "-I", sdk, entry.name, "-o", str(tmp_out)]]
    if entry.suffix == ".zig":
        return [[
            *_zig(), "build-exe", *ZIG_FLAGS,
            "--cache-dir", str(tmp / "cache"),
            "--name", "filter",
            "--dep", "sluice", f"-Mroot={entry.name}",
            f"-Msluice={os.path.join(sdk, 'sluice.zig')}",
            f"-femit-bin={tmp_out}",
        ]]
    if entry.suffix == ".rs":
        rustc = find_rustc()
        rlib = tmp / "libsluice.rlib"
        # Paths would end up in panic messages: name them the same from any directory.
        remap = ["--remap-path-prefix", f"{source_dir}=filter",
                 "--remap-path-prefix", f"{SDK_DIR}=sdk",
                 "--remap-path-prefix", f"{sdk}=sdk"]
        return [
            [rustc, *RUST_FLAGS, *remap, "--crate-type", "rlib", "--crate-name", "sluice",
             os.path.join(sdk, "rust", "sluice.rs"), "-o", str(rlib)],
            [rustc, *RUST_FLAGS, *remap, "--crate-type", "cdylib", "--crate-name", "filter",
             "-C", "lto", "-C", "strip=symbols", "--extern", f"sluice={rlib}",
             entry.name, "-o", str(tmp_out)],
        ]
    return [[*find_asc(), entry.name, *ASC_FLAGS, "--path",
             os.path.join(sdk, "assemblyscript"), "-o", str(tmp_out)]]


def build_filter(source_dir: Path, output: Path) -> Path:
    """Compile the filter in `source_dir` to `output` (a .wasm path); returns `output`.

    The compiler runs inside `source_dir` with relative paths and a private cache directory,
    so the bytes do not depend on where the directory lives.
    """
    source_dir = source_dir.resolve()
    output = output.resolve()
    entry = entry_source(source_dir)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sluice-build-") as tmp:
        tmp_out = Path(tmp) / "out.wasm"
        env = dict(os.environ)
        # zig cc caches object files; a private cache keeps builds independent of each other.
        env["ZIG_LOCAL_CACHE_DIR"] = str(Path(tmp) / "cache")
        if entry.suffix == ".go":
            go_cmd, go_dir = _go_command(entry, Path(tmp), tmp_out)
            env.update(GO_ENV)
            steps = [(go_cmd, go_dir)]
        elif entry.suffix == ".py":
            py_cmd, py_dir = _py_command(entry, Path(tmp), tmp_out)
            steps = [(py_cmd, py_dir)]
        elif entry.name == "Cargo.toml":
            steps, cargo_env = _cargo_steps(source_dir, Path(tmp), tmp_out)
            env.update(cargo_env)
        elif entry.suffix == ".js":
            steps = [(_js_command(entry, source_dir, Path(tmp), tmp_out, env), source_dir)]
        else:
            steps = [(cmd, source_dir)
                     for cmd in _compile_command(entry, source_dir, Path(tmp), tmp_out)]
        for cmd, cwd in steps:
            try:
                proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
            except OSError as exc:
                raise BuildError(f"cannot run the compiler: {exc}") from exc
            if proc.returncode != 0:
                raise BuildError(f"{entry}: compilation failed\n"
                                 f"{(proc.stderr or proc.stdout).strip()}")
            if proc.stderr.strip():
                print(proc.stderr.strip(), file=sys.stderr)
        if entry.name == "Cargo.toml":
            shutil.copyfile(_cargo_output(source_dir, Path(tmp)), tmp_out)
        if not tmp_out.is_file():
            raise BuildError(f"{entry}: compilation failed (no module written)")
        shutil.copyfile(tmp_out, output)
    return output


def quickjs_dir() -> Path:
    """The QuickJS-ng sources: $SLUICE_QUICKJS, or where scripts/dev.sh unpacks them."""
    chosen = os.environ.get("SLUICE_QUICKJS")
    installed = Path(sys.prefix) / "share" / "sluice" / f"quickjs-ng-{QUICKJS_VERSION}"
    d = Path(chosen) if chosen else installed
    if not (d / "quickjs.c").is_file() or not (d / "quickjs.h").is_file():
        raise BuildError(JS_MISSING)
    return d


def quickjs_version(src: Path) -> str:
    """QJS_VERSION_MAJOR.MINOR.PATCH from quickjs.h."""
    parts = {}
    for line in (src / "quickjs.h").read_text().splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0] == "#define" and fields[1].startswith("QJS_VERSION_"):
            parts[fields[1][len("QJS_VERSION_"):]] = fields[2]
    return ".".join(parts.get(k, "?") for k in ("MAJOR", "MINOR", "PATCH"))


def _js_cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sluice" / "quickjs"


def quickjs_objects(env: dict[str, str]) -> list[Path]:
    """The engine compiled for wasm32-wasi: one object per QuickJS source, built once per
    machine (a minute or two) into a cache keyed by the sources, the compiler and the flags."""
    src = quickjs_dir()
    key = hashlib.sha256()
    key.update(zig_version().encode() + b"\0" + "\0".join(JS_ENGINE_FLAGS).encode())
    for name in sorted(p.name for p in src.iterdir() if p.suffix in (".c", ".h")):
        key.update(name.encode() + b"\0" + (src / name).read_bytes())
    out = _js_cache_root() / key.hexdigest()[:24]
    objects = [out / (Path(name).stem + ".o") for name in QUICKJS_SOURCES]
    if all(o.is_file() for o in objects):
        return objects
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="build-", dir=out.parent))
    try:
        # Relative source names: assert() puts __FILE__ into the module, and it must not
        # depend on where the sources live.
        procs = [(name, subprocess.Popen(
            [*_zig(), "cc", *JS_ENGINE_FLAGS, "-c", name, "-o",
             str(staging / (Path(name).stem + ".o"))],
            cwd=src, env={**env, "ZIG_LOCAL_CACHE_DIR": str(staging / "cache")},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            for name in QUICKJS_SOURCES]
        failed = []
        for name, proc in procs:
            _, err = proc.communicate()
            if proc.returncode != 0:
                failed.append(f"{name}: {err.strip()}")
        if failed:
            raise BuildError("compiling QuickJS-ng failed\n" + "\n".join(failed))
        shutil.rmtree(staging / "cache", ignore_errors=True)
        try:
            staging.rename(out)
        except OSError:
            if not all(o.is_file() for o in objects):  # not another build's finished copy
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return objects


# A call of the SDK's onAdmin in filter.js (a mention in a comment or string counts too: the
# module then exports sluice_admin, whose calls fail with "does not handle admin requests").
_JS_ON_ADMIN = re.compile(r"\bonAdmin\s*\(")


def _c_array(name: str, data: bytes) -> str:
    body = ",".join(str(b) for b in data)
    return (f"const unsigned char {name}[] = {{{body}{',' if data else ''}0}};\n"
            f"const unsigned int {name}_len = {len(data)}u;\n")


def _js_command(entry: Path, source_dir: Path, tmp: Path, tmp_out: Path,
                env: dict[str, str]) -> list[str]:
    """Link the shim, the SDK module and the filter's source (embedded as data) with the
    cached engine objects."""
    objects = quickjs_objects(env)
    embedded = tmp / "embedded.c"
    embedded.write_text(_c_array("sluice_js_sdk", (SDK_DIR / "js" / "sluice.js").read_bytes())
                        + _c_array("sluice_js_filter", entry.read_bytes()))
    sdk = os.path.relpath(SDK_DIR, source_dir)
    # sluice_admin only for a filter that registers an admin function: a record filter's
    # module stays without it (and cannot be bound to admin).
    admin = ["-DSLUICE_JS_ADMIN=1"] if _JS_ON_ADMIN.search(entry.read_text()) else []
    return [*_zig(), "cc", *JS_FLAGS, *admin, "-I", str(quickjs_dir()), "-I", sdk,
            os.path.join(sdk, "js", "sluice_js.c"), str(embedded), *map(str, objects),
            "-o", str(tmp_out)]


def _subdirs(parent: Path) -> list[Path]:
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def targets() -> list[Target]:
    """Every filter target of the repository, builtins first, sorted by name."""
    found: list[Target] = []
    for d in _subdirs(SRC_DIR):
        found.append(Target(d.name, d, BUILTIN_DIR / f"{d.name}.wasm"))
    for d in _subdirs(EXAMPLES_DIR):
        found.append(Target(d.name, d, d / f"{d.name}.wasm"))
    return found


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def py_sources_digest(source_dir: Path) -> str:
    """sha256 over what a Python filter is built from: filter.py, the SDK, the world, the
    build's shim and the componentize-py version. It keys the build's fake randomness (sdk/python/
    reproducible_shim.c), so CPython's hash secret in the module follows from the sources."""
    h = hashlib.sha256(f"componentize-py {COMPONENTIZE_PY_VERSION}\n".encode())
    files = [source_dir / "filter.py", SDK_DIR / "python" / "sluice_app.py",
             *sorted((SDK_DIR / "python" / "sluice_filter").glob("*.py")),
             *sorted((SDK_DIR / "python" / "wit").glob("*.wit")), PY_SHIM_SOURCE]
    for f in files:
        h.update(f"{f.name}\n".encode() + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def build_all() -> int:
    for t in targets():
        build_filter(t.source_dir, t.output)
        print(f"built {t.output.relative_to(FILTERS_DIR.parent)}  sha256={_sha256(t.output)}")
    return 0


def _versions_match(suffixes: set[str]) -> bool:
    """Whether the installed compilers are the ones the committed modules were built with:
    another version may emit other bytes, so --check refuses to compare across versions."""
    found: list[tuple[str, str, str]] = []
    if suffixes & {".c", ".zig"}:
        found.append(("ziglang", zig_version(), ZIG_VERSION))
    if suffixes & {".rs", ".toml"}:
        found.append(("rustc", rustc_version(find_rustc()), RUST_VERSION))
    if ".ts" in suffixes:
        found.append(("assemblyscript", asc_version(find_asc()), ASC_VERSION))
    if ".go" in suffixes:
        found.append(("go", go_version(find_go()), GO_VERSION))
    if ".js" in suffixes:
        found.append(("ziglang", zig_version(), ZIG_VERSION))
        found.append(("quickjs-ng", quickjs_version(quickjs_dir()), QUICKJS_VERSION))
    if ".py" in suffixes:
        found.append(("componentize-py", componentize_py_version(find_componentize_py()),
                      COMPONENTIZE_PY_VERSION))
    ok = True
    for tool, have, want in found:
        if have != want:
            print(f"{tool} {have} installed, the modules are built with {want}", file=sys.stderr)
            ok = False
    return ok


def check_all() -> int:
    """Rebuild every target into a temporary directory and compare with the committed files."""
    if not _versions_match({entry_source(t.source_dir).suffix for t in targets()}):
        return 1
    failures = 0
    with tempfile.TemporaryDirectory(prefix="sluice-check-") as tmp:
        todo = targets()
        # Each build is a compiler process in a directory of its own, so they run side by side
        # (one per core, at most four: a Go or componentize-py build takes hundreds of MB);
        # the results are compared in the targets' order.
        with ThreadPoolExecutor(max_workers=min(os.cpu_count() or 1, 4)) as pool:
            built = list(pool.map(
                lambda t: build_filter(t.source_dir, Path(tmp) / f"{t.name}.wasm"), todo))
        for t, fresh in zip(todo, built, strict=True):
            rel = t.output.relative_to(FILTERS_DIR.parent)
            if not t.output.is_file():
                print(f"MISSING {rel} (run python filters/build.py)")
                failures += 1
            elif fresh.read_bytes() != t.output.read_bytes():
                print(f"DIFFERS {rel}: committed {_sha256(t.output)[:16]}, "
                      f"rebuilt {_sha256(fresh)[:16]}")
                failures += 1
            else:
                print(f"ok      {rel}  sha256={_sha256(fresh)}")
    if failures:
        print(f"{failures} module(s) do not match their sources", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build Sluice's Wasm filters reproducibly.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="fail if a committed .wasm differs")
    mode.add_argument("--list", action="store_true", help="print the targets")
    args = parser.parse_args(argv)
    try:
        if args.list:
            for t in targets():
                print(f"{t.source_dir.relative_to(FILTERS_DIR.parent)} -> "
                      f"{t.output.relative_to(FILTERS_DIR.parent)}")
            return 0
        return check_all() if args.check else build_all()
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
