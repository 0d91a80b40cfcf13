"""Differential check of two builds of builtin:pii-mask: the same decisions on every record.

    python -m tests.filters.builtin.pii_mask_differential OLD.wasm [NEW.wasm] [--random N]

NEW defaults to the committed filters/builtin/pii-mask.wasm; OLD is any other build (e.g.
`git show HEAD~1:filters/builtin/pii-mask.wasm > /tmp/old.wasm`). A change meant to make the
filter faster without changing what it masks must print 0 differing records. Records: the two
labelled corpora (pii_corpus, pii_locale_corpus with two seeds), random texts and JSON records
glued from their labelled values and bytes that start or end matches, generated groups of
digits (card, phone and SSN shapes, Luhn-valid or not), long texts of digits and separators
(the numeric prefilter of strings over 64 bytes), JSON records of card-shaped strings (the
early card decision, card_shape), and texts and JSON records near the record-level reject
(record_clean), and JSON records with many matches, some copied and some broken (the in-place
masks), the benchmarks' records (bench.workload, bench.bench_pii_mask), JSON numbers of every
length and shape (the numbers' digit runs) and records of every length up to 300 bytes with
one byte that rules out the record-level reject, values after white space or a BOM, and some
sets again as keys and header values too; each set under several configurations. Counters are
compared in the order reported. Prints the first few differences.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.bench_pii_mask import json_values, text_values
from bench.workload import json_records
from tests.filters.builtin import pii_corpus, pii_locale_corpus
from tests.filters.builtin.conftest import BUILTIN
from tests.filters.sdk.guest_abi import Guest, Rec

CONFIGS: list[dict[str, Any]] = [
    {}, {"mode": "text"}, {"mode": "json"}, {"keep_last": 4, "mask": "#"},
    {"preserve_format": False, "replacement": "[x]"}, {"fields": ["a", "n[*]"]},
    {"detectors": ["email", "card"]}, {"detectors": ["phone", "ssn", "card"]},
]
GLUE = ["", " ", "-", ".", "\"", "\\", "\n", "@", "A", "AKIA", "+", "(", ")", "0", "00", "1",
        "=", ":", "bearer ", "eyJ", "x", "é", "\uff14", "\uff0d", "\u3000", "電話", "tel: ", "key=",
        "aws_secret_access_key = ", "e", "b", "DE", "GB26 ", "12", "123", "1234 ", "x" * 17,
        "9" * 13, "a@b.c"]


def corpus_texts() -> list[str]:
    texts = [s.text for s in pii_locale_corpus.build_corpus()]
    texts += [s.text for s in pii_locale_corpus.build_corpus(seed=7)]
    texts += [s.text for s in pii_corpus.build_corpus()]
    return texts


def glued_texts(n: int, rng: random.Random) -> Iterator[str]:
    pieces = [s.text[a:b] for s in pii_locale_corpus.build_corpus() for (_, a, b) in s.labels]
    for _ in range(n):
        parts = [rng.choice(pieces) if rng.random() < 0.4 else rng.choice(GLUE)
                 for _ in range(rng.randint(1, 12))]
        text = "".join(parts)
        if rng.random() < 0.3:
            text = rng.choice(GLUE) * rng.randint(0, 5) + text + "z" * rng.randint(0, 40)
        yield text
        if rng.random() < 0.3:
            yield json.dumps({"a": text, "phone": text[:20], "n": [text, 1234567890123],
                              "secret_key": "zz"}, ensure_ascii=rng.random() < 0.5)


def luhn_fix(text: str) -> str:
    """text with its last digit changed so that its digits pass Luhn."""
    digits = [int(c) for c in text if c.isdigit()]
    at = max(i for i, c in enumerate(text) if c.isdigit())
    for last in range(10):
        ds = [*digits[:-1], last]
        total = sum(d if i % 2 == 0 else (2 * d - 9 if d > 4 else 2 * d)
                    for i, d in enumerate(reversed(ds)))
        if total % 10 == 0:
            return text[:at] + str(last) + text[at + 1:]
    return text


def digit_group_texts(n: int, rng: random.Random) -> Iterator[str]:
    for _ in range(n):
        sep = rng.choice([" ", "-", "_", " ", "."])
        groups = ["".join(rng.choice("0123456789")
                          for _ in range(rng.choice([1, 2, 3, 4, 4, 4, 5, 6, 7, 13, 16])))
                  for _ in range(rng.randint(1, 8))]
        if rng.random() < 0.5:
            groups[0] = rng.choice(["4", "5", "6", "3", "2", "0604", "1800", "2131", "5018",
                                    "6761", "4111"]) + groups[0]
        text = sep.join(groups)
        if rng.random() < 0.3:
            text = luhn_fix(text)
        yield (rng.choice(["", "card ", "x", "DE89 ", "1.", "id-", "+", "(0) "]) + text
               + rng.choice(["", " ok", "0", ".5", "-x", " 12"]))


def card_shape_records(n: int, rng: random.Random) -> Iterator[str]:
    """JSON records whose string values have the card shapes the guest decides early: 16 digits
    alone or in four groups of four joined by one space, dash or underscore (issuer and Maestro
    prefixes, zeros starting groups, Luhn-valid or not), in card, phone and other members."""
    prefixes = ["4111", "5018", "5600", "5893", "6304", "6761", "0604", "0123", "1800", "2131",
                "3714", "6011", "7000", "9999", "2000", "6999"]
    for _ in range(n):
        def group() -> str:
            if rng.random() < 0.2:
                return rng.choice(prefixes)
            return "".join(rng.choice("0123456789000") for _ in range(4))
        groups = [rng.choice(prefixes) if rng.random() < 0.8 else group()] + [
            group() for _ in range(3)]
        text = rng.choice([" ", "-", "_", ""]).join(groups)
        if rng.random() < 0.5:
            text = luhn_fix(text)
        member = rng.choice(["card", "phone", "x", "mobile_no", "telefon", "cardNumber"])
        yield json.dumps({member: text, "n": 1})


def near_clean_texts(n: int, rng: random.Random) -> Iterator[str]:
    """Texts and JSON records of lower-case words, digits, separators, dots and colons, most
    without a trigger byte (the record-level reject) and many one byte from one: names before a
    ':' or '=' that end secret key names, "bearer", runs of 7 to 9 digits, dotted quads."""
    names = ["key", "token", "user_id", "note", "b", "abc", "x", "session_token", "secret_key",
             "aws.secret-key", "n", "y", "id", "bearer", "amount"]
    plain = "abcdefghijklmnopqrstuvwxyz0123456789 -_.()+:,/"
    for _ in range(n):
        alphabet = plain + "\"'\t\n" if rng.random() < 0.3 else plain
        parts: list[str] = []
        for _ in range(rng.randint(1, 10)):
            r = rng.random()
            if r < 0.3:
                parts.append(rng.choice(names) + rng.choice([":", ": ", " : ", "\":", "': ", "=",
                                                             "", " ", "\t:"]))
            elif r < 0.6:
                parts.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 9)))
                             + rng.choice([" ", "-", ".", "", "x", "(", ")", "+", "_"]))
            elif r < 0.65:
                parts.append(rng.choice(["10.0.0.1", "1.2.3", "256.1.1.1", "bearer abcdefgh12"]))
            else:
                parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))))
        text = "".join(parts)
        yield text
        yield json.dumps({rng.choice(names): text, "n": rng.choice([12, 1234567, 12345678, 1.5]),
                          rng.choice(names): [text[:10], "x"],
                          "id": rng.randrange(10 ** rng.randint(1, 9))})


def long_numeric_texts(n: int, rng: random.Random) -> Iterator[str]:
    alphabet = list("0123456789 -_.()+xaZ/:")
    shapes = ["+49 151 2345 6789", "123-45-6789", "(0131) 496 0163", "0049 30 1234567",
              "tel: ", "4111 1111 1111 1111", "415-555-0132"]
    for _ in range(n):
        parts: list[str] = []
        size = rng.randint(65, 260)
        while sum(map(len, parts)) < size:
            r = rng.random()
            if r < 0.3:
                parts.append(rng.choice([" ", "x", "-", "ab"]) * rng.randint(1, 40))
            elif r < 0.6:
                parts.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 16))))
            elif r < 0.7:
                parts.append(rng.choice(shapes))
            else:
                parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))))
        yield "".join(parts)


def many_match_records(n: int, rng: random.Random) -> Iterator[str]:
    """JSON records with up to 40 matching literals (more than the 16 matches that the walk
    notes and masks in place at its end; past them, and before a literal that is copied, the
    matches are masked at once and saved to be put back), mixed with literals that are copied
    (non-ASCII, escaped) and, in some, a broken end (the value is then read as text)."""
    values = ["a{}@example.com", "4111 1111 1111 1111", "x\u00e9 b{}@ex.org", "+44 20 7946 0{:03d}",
              "caf\u00e9 c{}@mail.de", "tab\t d{}@e.io", "plain {}", "123-45-6789"]
    for _ in range(n):
        members = []
        for k in range(rng.randint(1, 40)):
            v = rng.choice(values).format(rng.randrange(1000))
            members.append(f'"m{k}": {json.dumps(v, ensure_ascii=rng.random() < 0.5)}')
        text = "{" + ", ".join(members) + "}"
        if rng.random() < 0.2:
            text = text[:-1] + rng.choice([",", " x", "]", ""])
        yield text


def bench_texts(n: int) -> list[str]:
    """The records bench_pii_mask times (its workload, pii, clean and text variants)."""
    values = json_records(n) + json_values(n, pii=True) + json_values(n, pii=False)
    values += text_values(n // 5, pii=True) + text_values(n // 5, pii=False)
    return [v.decode() for v in values]


def number_texts(n: int, rng: random.Random) -> Iterator[str]:
    """JSON numbers of 1 to 40 digits in each part, well-formed or not, inside records, alone
    and at a record's very end."""
    def digits(k: int) -> str:
        return "".join(rng.choice("0123456789") for _ in range(k))

    for _ in range(n):
        num = rng.choice(["", "-"]) + rng.choice(["0", digits(rng.randint(1, 40)), "0" + digits(2)])
        if rng.random() < 0.5:
            num += "." + digits(rng.randint(0, 40))
        if rng.random() < 0.3:
            num += rng.choice("eE") + rng.choice(["", "+", "-"]) + digits(rng.randint(0, 40))
        yield num
        yield json.dumps({"a": "x" * rng.randint(0, 70)})[:-1] + ", \"n\": " + num + "}"
        yield "[" + ", ".join([num] * rng.randint(1, 4)) + rng.choice(["]", "", " ]", "x]"])


def length_texts(n: int, rng: random.Random) -> Iterator[str]:
    """JSON records of every length up to 300 bytes, clean but for at most one byte that rules
    out the record-level reject by itself."""
    for _ in range(n):
        size = rng.randint(10, 300)
        body = "".join(rng.choice("abcdefxyz 0123,.-") for _ in range(size))
        if rng.random() < 0.7:
            k = rng.randrange(size)
            body = body[:k] + rng.choice("@A=Z\\é") + body[k + 1:]
        yield json.dumps({"v": body})


def padded_texts(n: int, rng: random.Random) -> Iterator[str]:
    """Objects, arrays, numbers, strings and texts after and before white space or a BOM (mode
    auto reads a value as JSON from its first byte that is not white space)."""
    space = ["", " ", "\t", "\n", "\r\n", "  \n ", "\ufeff", "\u00a0", "\x0b"]
    pieces = [s.text[a:b] for s in pii_locale_corpus.build_corpus() for (_, a, b) in s.labels]
    for _ in range(n):
        piece = rng.choice(pieces)
        body = rng.choice([json.dumps({"a": piece, "n": 4111111111111111}), json.dumps([piece, 12]),
                           json.dumps(piece), "4111111111111111", piece, "{" + piece, "[" + piece,
                           "}" + piece, '"' + piece])
        yield rng.choice(space) + body + rng.choice(space)


def compare(old: Path, new: Path, texts: list[str], configs: list[dict[str, Any]],
            fields: bool = False) -> int:
    """Records differing between the builds, and batches whose counters differ (in the order
    the builds report them). With fields, each record's key and headers are the texts before
    its value."""
    differing = 0
    for config in configs:
        a, b = Guest(old, config), Guest(new, config)
        for i in range(0, len(texts), 200):
            batch = texts[i:i + 200]
            recs = [Rec(t.encode(), batch[j - 1].encode() if fields else None,
                        [("x-pii", batch[j - 2].encode()), ("h", t[:9].encode())] if fields else [])
                    for j, t in enumerate(batch)]
            (da, ca), (db, cb) = a.run(recs), b.run(recs)
            for rec, x, y in zip(recs, da, db, strict=True):
                if x != y:
                    differing += 1
                    if differing <= 5:
                        print(f"DIFFERS under {config}: {rec!r}\n  old {x}\n  new {y}")
            if list(ca.items()) != list(cb.items()) and da == db:
                differing += 1
                print(f"COUNTS differ under {config}: old {ca}, new {cb}")
    return differing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path, nargs="?", default=BUILTIN / "pii-mask.wasm")
    ap.add_argument("--random", type=int, default=20000, help="glued texts (and as many JSON)")
    args = ap.parse_args()
    rng = random.Random(1)
    sets = [
        ("corpora and glued texts", corpus_texts() + list(glued_texts(args.random, rng)),
         CONFIGS[:7]),
        ("digit groups", list(digit_group_texts(3 * args.random, rng)), [{}, CONFIGS[6]]),
        ("long numeric texts", list(long_numeric_texts(2 * args.random, rng)),
         [{}, CONFIGS[7]]),
        ("card shapes in JSON", list(card_shape_records(args.random, rng)),
         [{}, CONFIGS[3], CONFIGS[6], CONFIGS[7], {"detectors": ["card"]}]),
        ("near-clean texts and JSON", list(near_clean_texts(args.random, rng)),
         [{}, CONFIGS[1], CONFIGS[2], CONFIGS[7], {"secret_keys": ["user_id", "abc", "x"]}]),
        ("JSON with many matches", list(many_match_records(args.random // 4, rng)),
         [{}, CONFIGS[2], CONFIGS[3],
          {"detectors": {"card": {"mask": "#"}, "phone": {"keep_last": 2}}}]),
        ("benchmark records", bench_texts(args.random // 5), [{}, CONFIGS[3], CONFIGS[5]]),
        ("JSON numbers", list(number_texts(args.random // 2, rng)),
         [{}, CONFIGS[2], CONFIGS[7]]),
        ("records of every length", list(length_texts(args.random, rng)),
         [{}, CONFIGS[1], CONFIGS[6]]),
        ("values after white space or a BOM", list(padded_texts(args.random, rng)),
         [{}, CONFIGS[2], CONFIGS[5]]),
    ]
    total = 0
    keyed = [{"keys": True, "headers": True}, {"keys": True, "headers": ["X-PII"], "mode": "json"},
             {"keys": True, "headers": True, "fields": ["a", "n[*]"]}]
    sets += [(f"{name}, as keys and headers too", texts[:args.random // 4], keyed)
             for name, texts, _ in sets[:1] + sets[-3:]]
    for name, texts, configs in sets:
        differing = compare(args.old, args.new, texts, configs, fields=", as keys" in name)
        print(f"{name}: {len(texts)} records x {len(configs)} configurations, "
              f"{differing} differ")
        total += differing
    return 1 if total else 0


if __name__ == "__main__":
    raise SystemExit(main())
