"""Build the Wasm filters in this repository (and users' filter directories) reproducibly.

A filter directory holds one entry source, ``filter.c`` (C, freestanding, with
``sluice_filter.h``) or ``filter.zig`` (Zig, with the ``sluice`` module), and builds to one
stripped wasm32-freestanding module with the ``ziglang`` wheel's compiler. The output depends
only on the sources and the compiler version, not on the directory it is built from.

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
import shutil
import subprocess
import sys
import tempfile
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
    """The entry file of a filter directory: filter.c or filter.zig (exactly one)."""
    found = [p for p in (source_dir / "filter.c", source_dir / "filter.zig") if p.is_file()]
    if not found:
        raise BuildError(f"{source_dir}: no filter.c or filter.zig")
    if len(found) > 1:
        raise BuildError(f"{source_dir}: both filter.c and filter.zig; keep one")
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
        sdk = os.path.relpath(SDK_DIR, source_dir)
        if entry.suffix == ".c":
            cmd = [*_zig(), "cc", *C_FLAGS, "-I", sdk, entry.name, "-o", str(tmp_out)]
        else:
            cmd = [
                *_zig(), "build-exe", *ZIG_FLAGS,
                "--cache-dir", str(Path(tmp) / "cache"),
                "--name", "filter",
                "--dep", "sluice", f"-Mroot={entry.name}",
                f"-Msluice={os.path.join(sdk, 'sluice.zig')}",
                f"-femit-bin={tmp_out}",
            ]
        env = dict(os.environ)
        # zig cc caches object files; a private cache keeps builds independent of each other.
        env["ZIG_LOCAL_CACHE_DIR"] = str(Path(tmp) / "cache")
        try:
            proc = subprocess.run(cmd, cwd=source_dir, capture_output=True, text=True, env=env)
        except OSError as exc:
            raise BuildError(f"cannot run the compiler: {exc}") from exc
        if proc.returncode != 0 or not tmp_out.is_file():
            raise BuildError(f"{entry}: compilation failed\n{proc.stderr.strip()}")
        if proc.stderr.strip():
            print(proc.stderr.strip(), file=sys.stderr)
        shutil.copyfile(tmp_out, output)
    return output


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


def build_all() -> int:
    for t in targets():
        build_filter(t.source_dir, t.output)
        print(f"built {t.output.relative_to(FILTERS_DIR.parent)}  sha256={_sha256(t.output)}")
    return 0


def check_all() -> int:
    """Rebuild every target into a temporary directory and compare with the committed files."""
    version = zig_version()
    if version != ZIG_VERSION:
        print(f"ziglang {version} installed, the modules are built with {ZIG_VERSION}",
              file=sys.stderr)
        return 1
    failures = 0
    with tempfile.TemporaryDirectory(prefix="sluice-check-") as tmp:
        for t in targets():
            fresh = build_filter(t.source_dir, Path(tmp) / f"{t.name}.wasm")
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
