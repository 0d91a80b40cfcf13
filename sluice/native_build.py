"""What the cffi build scripts of the native modules share (codec/record_check_build.py,
filters/epoch_ticker_build.py, filters/host_sha256_build.py, filters/native_call_build.py,
crypto/batch_seal_build.py): compile a builder's module in a scratch folder and put the result
next to its sources, where the package imports it from (it is not committed)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cffi import FFI


def build_beside(ffi: FFI, folder: Path) -> int:
    """Compiles `ffi` (set up with cdef and set_source) and installs the module in `folder`;
    the exit status for the build script's `main`."""
    with tempfile.TemporaryDirectory() as tmp:
        _install(Path(ffi.compile(tmpdir=tmp, verbose=False)), folder)
    return 0


def _install(built: Path, folder: Path) -> None:
    """Copies the built module `built` into `folder` under its own name."""
    target = folder / built.name
    # A new file renamed over the old one: a running proxy keeps its mapping of the old
    # module intact (writing into a mapped library in place can crash it).
    fresh = target.with_name(target.name + ".new")
    fresh.write_bytes(built.read_bytes())
    os.replace(fresh, target)
    print(f"built {target.name}")


def libcrypto_ffi(module: str, source: Path, cdef: str) -> FFI:
    """An FFI for `source` (a C file) as the importable `module`, linked against OpenSSL's
    libcrypto. Deprecation warnings are off: OpenSSL 3 still ships the low-level interfaces
    it deprecates, and host_sha256.c's fallback uses its SHA-256 block function."""
    ffi = FFI()
    ffi.cdef(cdef)
    ffi.set_source(module, source.read_text(), libraries=["crypto"],
                   extra_compile_args=["-O2", "-Wno-deprecated-declarations"])
    return ffi


def build_extension_beside(name: str, sources: list[Path], folder: Path) -> int:
    """Compiles `sources` as the CPython extension module `name` (plain C against Python's
    own headers, for readers that return Python objects, which cffi cannot make) and
    installs it in `folder`, as `build_beside` does; the exit status for `main`."""
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    with tempfile.TemporaryDirectory() as tmp:
        ext = Extension(name, [str(s) for s in sources], extra_compile_args=["-O2"])
        cmd = build_ext(Distribution({"name": name, "ext_modules": [ext]}))
        cmd.build_lib = cmd.build_temp = tmp
        cmd.ensure_finalized()
        cmd.run()
        _install(Path(cmd.get_ext_fullpath(name)), folder)
    return 0
