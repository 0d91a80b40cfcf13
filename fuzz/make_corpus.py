"""Seed corpora for the atheris targets: valid inputs the fuzzer then mutates.

python fuzz/make_corpus.py [DIR]      # default fuzz/corpus/{frames,records,abi}
"""

from __future__ import annotations

import sys
from pathlib import Path

import _common  # noqa: F401  (sys.path)

from bench import wire
from sluice.codec.messages import encode_request
from sluice.codec.records import BatchHeader, Record, build_batch
from sluice.filters.decisions import Action, Decision
from sluice.filters.records_io import encode_filter_output


def records_seeds() -> list[bytes]:
    out = []
    for codec in range(5):
        recs = [
            Record(
                i,
                i * 3,
                f"k{i}".encode(),
                f'{{"n": {i}, "mail": "a@b.co"}}'.encode(),
                [("h", b"v")],
            )
            for i in range(4)
        ]
        for pid in (-1, 42):
            header = BatchHeader(
                0,
                0,
                -1,
                2,
                0,
                codec,
                3,
                1000,
                1009,
                pid,
                0 if pid > 0 else -1,
                0 if pid > 0 else -1,
                4,
            )
            out.append(build_batch(header, recs))
    out.append(out[0] + out[1])
    return out


def frames_seeds() -> list[bytes]:
    # The frames target reads a selector (key/version, direction, chunk size) first.
    produce = encode_request(wire.produce_request(9, [("t", 0, records_seeds()[0])]))
    metadata = encode_request(wire.metadata_request(12, ["t"]))
    return [b"\x00\x00\x00\x00\x01\x08" + produce, b"\x00\x00\x00\x01\x00\x10" + metadata]


def abi_seeds() -> list[bytes]:
    decisions = [
        Decision(Action.KEEP),
        Decision(Action.REWRITE, key=None, value=b"masked", headers=[("x", None)]),
        Decision(Action.DROP),
        Decision(Action.REJECT, reason="no"),
    ]
    return [b"\x04" + encode_filter_output(decisions, {"email": 2})]


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "corpus"
    for name, seeds in (
        ("records", records_seeds()),
        ("frames", frames_seeds()),
        ("abi", abi_seeds()),
    ):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        for i, seed in enumerate(seeds):
            (d / f"seed-{i:02d}").write_bytes(seed)
        print(f"{d}: {len(seeds)} seeds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
