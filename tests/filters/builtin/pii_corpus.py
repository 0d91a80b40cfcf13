"""A labelled corpus for builtin:pii-mask and its precision / recall, per detector.

Run it to print the table:  python -m tests.filters.builtin.pii_corpus
(test_pii_corpus.py asserts the figures stay above their floors).

The corpus is generated from a fixed seed: positives (valid card numbers, IBANs with correct
check digits, SSNs, phones in E.164 and national formats, e-mails, IPv4, AWS key ids and
KEY=value secrets, bearer tokens, JWTs) embedded in sentences and JSON, and near-misses that
look alike (card numbers failing Luhn, IBANs failing mod-97, version numbers, timestamps,
epoch seconds and milliseconds, hex hashes, UUIDs, order numbers, dates, prices, coordinates,
out-of-range IPs, invalid SSN areas). Each detector is configured with a replacement marker
``<<name>>`` so that every masked span can be attributed: a predicted (detector, text) pair
is a true positive when the corpus labels exactly that text with that detector.
"""

from __future__ import annotations

import base64
import json
import random
import re
import string
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.runtime import LoadedFilter, load_filter

DETECTORS = ("email", "card", "phone", "ssn", "iban", "ipv4", "aws_access_key",
             "aws_secret_key", "jwt", "bearer")
SEED = 20261121


@dataclass
class Sample:
    """One record value and the (detector, exact text) pairs that must be masked in it."""

    text: str
    labels: list[tuple[str, str]] = field(default_factory=list)


# --- generators of positives -------------------------------------------------------------

def luhn_digit(body: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(body)):
        d = int(ch)
        if i % 2 == 0:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return str((10 - total % 10) % 10)


def card(rng: random.Random, valid: bool = True) -> str:
    prefix, length = rng.choice([("4", 16), ("4", 13), ("51", 16), ("55", 16), ("2221", 16),
                                 ("34", 15), ("37", 15), ("6011", 16), ("65", 16),
                                 ("35", 16), ("62", 19)])
    body = prefix + "".join(rng.choice(string.digits) for _ in range(length - len(prefix) - 1))
    check = luhn_digit(body)
    if not valid:
        check = str((int(check) + rng.randint(1, 9)) % 10)
    number = body + check
    style = rng.choice(["plain", "space", "dash"])
    if style == "plain" or length not in (16, 19):
        return number
    sep = " " if style == "space" else "-"
    return sep.join(number[i:i + 4] for i in range(0, length, 4))


IBAN_SHAPES = {"DE": "8n10n", "GB": "4a14n", "FR": "10n11c2n", "NL": "4a10n", "ES": "20n",
               "IT": "1a10n12c", "BE": "12n", "CH": "5n12c", "AT": "16n", "PL": "24n"}


def iban(rng: random.Random, valid: bool = True, spaced: bool = False) -> str:
    cc = rng.choice(sorted(IBAN_SHAPES))
    shape = IBAN_SHAPES[cc]
    bban = ""
    num = ""
    for ch in shape:
        if ch.isdigit():
            num += ch
            continue
        pool = {"n": string.digits, "a": string.ascii_uppercase,
                "c": string.digits + string.ascii_uppercase}[ch]
        bban += "".join(rng.choice(pool) for _ in range(int(num)))
        num = ""
    rearranged = bban + cc + "00"
    value = int("".join(str(int(c, 36)) for c in rearranged))
    check = 98 - value % 97
    if not valid:
        check = (check + rng.randint(1, 96)) % 97 or 1
        if check == 98 - value % 97:
            check = check % 96 + 1
    text = f"{cc}{check:02d}{bban}"
    if spaced:
        text = " ".join(text[i:i + 4] for i in range(0, len(text), 4))
    return text


def ssn(rng: random.Random) -> str:
    area = rng.choice([a for a in range(1, 900) if a != 666])
    return f"{area:03d}-{rng.randint(1, 99):02d}-{rng.randint(1, 9999):04d}"


def phone(rng: random.Random) -> str:
    n = rng.randint(2, 9)
    a, b, c = f"{n}{rng.randint(0, 99):02d}", f"{rng.randint(2, 9)}{rng.randint(0, 99):02d}", \
        f"{rng.randint(0, 9999):04d}"
    return rng.choice([
        f"+1 {a}-{b}-{c}", f"({a}) {b}-{c}", f"{a}-{b}-{c}", f"{a}.{b}.{c}",
        f"+44 20 {rng.randint(7000, 7999)} {rng.randint(1000, 9999)}",
        f"+49 151 {rng.randint(10000000, 99999999)}",
        f"+4915{rng.randint(100000000, 999999999)}",
        f"020 {rng.randint(7000, 7999)} {rng.randint(1000, 9999)}",
        f"030-{rng.randint(1000000, 9999999)}",
        f"06 {rng.randint(10, 99)} {rng.randint(10, 99)} {rng.randint(10, 99)} "
        f"{rng.randint(10, 99)}",
        f"+33 6 {rng.randint(10, 99)} {rng.randint(10, 99)} {rng.randint(10, 99)} "
        f"{rng.randint(10, 99)}",
        f"1-{a}-{b}-{c}",
    ])


def email(rng: random.Random) -> str:
    user = rng.choice(["ann", "bob.smith", "j.doe+news", "x_y", "admin", "o'neil", "li.wei2"])
    user = user.replace("'", "")
    host = rng.choice(["example.com", "mail.example.co.uk", "corp-mail.io", "uni.edu", "x.de"])
    return f"{user}@{host}"


def ipv4(rng: random.Random) -> str:
    return ".".join(str(rng.randint(0, 255)) for _ in range(4))


def aws_key(rng: random.Random) -> str:
    return rng.choice(["AKIA", "ASIA"]) + "".join(
        rng.choice(string.ascii_uppercase + "234567") for _ in range(16))


def secret(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits + "/+") for _ in range(40))


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(rng: random.Random) -> str:
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = b64url(json.dumps({"sub": str(rng.randint(1, 10**9)), "iat": 1700000000}).encode())
    sig = b64url(bytes(rng.randrange(256) for _ in range(32)))
    return f"{header}.{payload}.{sig}"


def opaque_token(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits + "-._~") for _ in range(32))


# --- near-misses -------------------------------------------------------------------------

def near_misses(rng: random.Random) -> Iterator[str]:
    for _ in range(20):
        yield f"order number {card(rng, valid=False)} was shipped"
    for _ in range(15):
        yield f"wire to {iban(rng, valid=False, spaced=rng.random() < 0.5)} failed validation"
    for _ in range(10):
        yield (f"release v{rng.randint(0, 9)}.{rng.randint(0, 20)}.{rng.randint(0, 50)} "
               f"and {rng.randint(1, 3)}.{rng.randint(0, 9)}.{rng.randint(0, 99)}")
    for _ in range(10):
        yield (f"at 20{rng.randint(10, 30)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
               f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
               f".{rng.randint(0, 999):03d}+01:00")
    for _ in range(10):
        secs, ms = rng.randint(1_500_000_000, 1_900_000_000), rng.randint(10**12, 2 * 10**12)
        yield f"epoch {secs} ms {ms}"
    for _ in range(10):
        n = rng.choice([32, 40, 64])
        yield f"sha {''.join(rng.choice('0123456789abcdef') for _ in range(n))}"
    for _ in range(5):
        yield f"commit {''.join(rng.choice('0123456789abcdef') for _ in range(7))} by ci"
    for _ in range(8):
        h = "".join(rng.choice("0123456789abcdef") for _ in range(32))
        yield f"request {h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]} done"
    for _ in range(8):
        invoice, cents = rng.randint(10**9, 10**10 - 1), rng.randint(100, 99999)
        yield f"invoice {invoice} total {cents // 100}.{cents % 100:02d} EUR"
    for _ in range(5):
        yield f"coords {rng.uniform(-90, 90):.4f},{rng.uniform(-180, 180):.4f}"
    for _ in range(5):
        rest = ".".join(str(rng.randint(0, 255)) for _ in range(3))
        yield f"peer {rng.randint(256, 999)}.{rest}"
    for _ in range(5):
        area = rng.choice(["000", "666", "912"])
        yield f"ssn-like {area}-{rng.randint(10, 99)}-{rng.randint(1000, 9999)}"
    for _ in range(5):
        yield f"date {rng.randint(1, 28):02d}-{rng.randint(1, 12):02d}-{rng.randint(1990, 2030)}"
    for _ in range(5):
        yield f"build {rng.randint(100, 999)}-{rng.randint(100, 999)}-{rng.randint(10000, 99999)}"
    yield "contact us at support (at) example dot com or user@localhost"
    yield "the bearer of this note is authorised"
    yield "price: 1234 5678 units, room 101, zip 94103"
    yield "AKIA is a prefix; AKIAEXAMPLE is too short"
    yield "eyJ is how JSON looks in base64"
    yield "version 10.0.19045 build 3803"
    yield "call me at extension 4412"
    # realistic look-alikes the detectors are known to be weak on (kept to stay honest)
    for _ in range(30):
        yield f"tracking id {rng.randint(10**15, 10**16 - 1)}"
    yield "driver 10.0.3.1 installed"  # a four-part version number reads as an IPv4
    yield "firmware 4.2.1.0 rolled out"
    yield "ticket 415-555-0199 escalated"  # shaped like a NANP phone number
    yield "ISBN 978-3-16-148410-0"


# --- the corpus ---------------------------------------------------------------------------

def build_corpus(seed: int = SEED) -> list[Sample]:
    rng = random.Random(seed)
    samples: list[Sample] = []

    def add(template: str, det: str, value: str) -> None:
        samples.append(Sample(template.format(value), [(det, value)]))

    for _ in range(25):
        v = card(rng)
        add(rng.choice(["paid with {}", "card: {}.", "cc={} exp 12/29", "{}"]), "card", v)
    for _ in range(20):
        v = iban(rng, spaced=rng.random() < 0.5)
        add(rng.choice(["IBAN {}", "send to {} please", "account: {}"]), "iban", v)
    for _ in range(15):
        add(rng.choice(["SSN {} on file", "ssn: {}", "({})"]), "ssn", ssn(rng))
    for _ in range(25):
        add(rng.choice(["call {} now", "tel: {}", "phone {}, ask for Ann"]), "phone", phone(rng))
    for _ in range(15):
        add(rng.choice(["mail {} today", "<{}>", "from: {}"]), "email", email(rng))
    for _ in range(10):
        add(rng.choice(["client {} connected", "ip={}:443", "from {}"]), "ipv4", ipv4(rng))
    for _ in range(8):
        add(rng.choice(["key {} rotated", "AWS_ACCESS_KEY_ID={}"]), "aws_access_key",
            aws_key(rng))
    for _ in range(8):
        add(rng.choice(["AWS_SECRET_ACCESS_KEY={}", "aws_secret_access_key = {}",
                        "export AWS_SESSION_TOKEN='{}'"]), "aws_secret_key", secret(rng))
    for _ in range(8):
        add(rng.choice(["Authorization: Bearer {}", "token={} (jwt)", "{}"]), "jwt", jwt(rng))
    for _ in range(8):
        add("Authorization: Bearer {}", "bearer", opaque_token(rng))
    # realistic formats the detectors are known to miss (kept to stay honest)
    for text, det, value in [
        ("call 555-0132 at night", "phone", "555-0132"),  # 7-digit local number
        ("phone 4155550132", "phone", "4155550132"),  # unformatted national number
        ("ring (0)20 7946 0958", "phone", "(0)20 7946 0958"),
        ("mail José.Núñez@exämple.de", "email", "José.Núñez@exämple.de"),
        ("card 4111.1111.1111.1111", "card", "4111.1111.1111.1111"),
        ("iban de89 3704 0044 0532 0130 00", "iban", "de89 3704 0044 0532 0130 00"),
        ("ssn 078051120 on file", "ssn", "078051120"),
        ("host 010.001.002.003", "ipv4", "010.001.002.003"),
        ("Authorization: Bearer abc123", "bearer", "abc123"),
        ("MAIL: ANN@EXAMPLE.COM", "email", "ANN@EXAMPLE.COM"),
        ("amex 3782 822463 10005", "card", "3782 822463 10005"),
        ("tel +1 (415) 555-0132", "phone", "+1 (415) 555-0132"),
    ]:
        samples.append(Sample(text, [(det, value)]))
    samples.append(Sample("AWS_SECRET_ACCESS_KEY=myawssecretkeyvalue \nMy email is "
                          "example@email.com",
                          [("aws_secret_key", "myawssecretkeyvalue"),
                           ("email", "example@email.com")]))
    # several kinds in one JSON record (detectors run inside the string values)
    for _ in range(10):
        e, p, c = email(rng), phone(rng), card(rng)
        doc = {"user": {"email": e, "phone": p}, "payment": {"card": c}, "note": "thanks"}
        samples.append(Sample(json.dumps(doc), [("email", e), ("phone", p), ("card", c)]))
    for text in near_misses(rng):
        samples.append(Sample(text))
    return samples


# --- evaluation ---------------------------------------------------------------------------

def marker_filter() -> LoadedFilter:
    detectors = {d: {"replacement": f"<<{d}>>"} for d in DETECTORS}
    # mode text: the markers are attributed on the raw text, JSON included
    spec = FilterSpec(name="pii-corpus", module="builtin:pii-mask",
                      config={"mode": "text", "detectors": detectors})
    return load_filter(spec)


def evaluate(samples: list[Sample]) -> dict[str, Counter[str]]:
    """Per detector: tp, fp, fn counts."""
    f = marker_filter()
    ctx = RecordContext(topic="corpus", partition=0, direction="produce")
    recs = [FilterRecord(i, 0, None, s.text.encode(), []) for i, s in enumerate(samples)]
    result = f.run_batch(ctx, recs)
    f.close()
    stats: dict[str, Counter[str]] = {d: Counter() for d in DETECTORS}
    for sample, decision in zip(samples, result.decisions, strict=True):
        masked = decision.value.decode() if decision.value is not None else sample.text
        got = attribute(sample.text, masked)
        want = Counter(sample.labels)
        for pair, n in got.items():
            hit = min(n, want[pair])
            stats[pair[0]]["tp"] += hit
            stats[pair[0]]["fp"] += n - hit
        for pair, n in want.items():
            stats[pair[0]]["fn"] += max(0, n - got[pair])
    return stats


def attribute(original: str, masked: str) -> Counter[tuple[str, str]]:
    """Recover (detector, original text) pairs: the masked text is the original with spans
    replaced by markers, so a regex of its literal parts around ``(.+?)`` groups aligns them
    (a full match; an unaligned result means the filter changed unmasked text)."""
    pieces = re.split(r"<<([a-z_0-9]+)>>", masked)
    names = pieces[1::2]
    pattern = "(.+?)".join(re.escape(lit) for lit in pieces[0::2])
    m = re.fullmatch(pattern, original, flags=re.DOTALL)
    if m is None:
        raise AssertionError(f"cannot align {masked!r} with {original!r}")
    return Counter(zip(names, m.groups(), strict=True))


def report(stats: dict[str, Counter[str]]) -> tuple[float, float, str]:
    lines = [f"{'detector':16} {'tp':>4} {'fp':>4} {'fn':>4} {'precision':>9} {'recall':>7}"]
    total: Counter[str] = Counter()
    for det in DETECTORS:
        s = stats[det]
        total.update(s)
        p = s["tp"] / (s["tp"] + s["fp"]) if s["tp"] + s["fp"] else 1.0
        r = s["tp"] / (s["tp"] + s["fn"]) if s["tp"] + s["fn"] else 1.0
        lines.append(f"{det:16} {s['tp']:4} {s['fp']:4} {s['fn']:4} {p:9.3f} {r:7.3f}")
    precision = total["tp"] / (total["tp"] + total["fp"])
    recall = total["tp"] / (total["tp"] + total["fn"])
    lines.append(f"{'all':16} {total['tp']:4} {total['fp']:4} {total['fn']:4} "
                 f"{precision:9.3f} {recall:7.3f}")
    return precision, recall, "\n".join(lines)


def main() -> None:
    samples = build_corpus()
    positives = sum(len(s.labels) for s in samples)
    negatives = sum(1 for s in samples if not s.labels)
    print(f"corpus: {len(samples)} records, {positives} labelled items, "
          f"{negatives} near-miss records")
    _, _, table = report(evaluate(samples))
    print(table)


if __name__ == "__main__":
    main()
