"""An independent multi-locale corpus for builtin:pii-mask: recall per detector and keep-rate.

Run it to print the table:  python -m tests.filters.builtin.pii_locale_corpus
(test_pii_locale_corpus.py asserts the targets: recall >= 0.97 on every detector, keep >= 0.99).

Unlike pii_corpus.py, whose positives were written by the people who wrote the detectors, the
values here come from generators: Faker (e-mails, phone numbers, card numbers, IBANs, US SSNs,
IPv4 addresses, names, addresses and sentences in eleven locales) and phonenumbers (valid
fixed-line and mobile numbers of eleven regions, formatted as its metadata says: national,
international, E.164). Only the AWS key ids, secrets and tokens, which neither generates, are
drawn here from their documented alphabets, and written as the AWS CLI (credentials file and
`sts` JSON), Terraform and Java properties write them.

Each value sits in a sentence of its locale (with a label word, or glued to the text without
spaces as CJK text is written, or in « » / 「 」 quotes) or in a JSON record with other
generated fields. Near-misses that must stay unmasked: Luhn-valid stretches inside longer
numbers (the whole run longer than 19 digits or failing Luhn itself: otherwise it is a card
number), IBANs whose check digits fail, dates, order numbers, UUIDs, version strings, prices.

Every detector masks with its own private-use character and ``preserve_format: false``, so
each masked character of the output names its detector and lines up with the input character
by character. A value is found when all its letters and digits (a phone: its digits) are masked
by its detector. Keep-rate is the share of near-miss records the filter left as they were;
``spill`` counts characters masked outside any labelled value in the positive records.
"""

from __future__ import annotations

import json
import random
import string
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import phonenumbers
from faker import Faker

from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.runtime import LoadedFilter, load_filter

SEED = 20261128
# dates are drawn before a fixed day, not before now, so that the corpus does not change
END = datetime(2026, 1, 1)
LOCALES = ("en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT", "pt_BR", "nl_NL", "ja_JP",
           "zh_CN", "hi_IN")
REGIONS = {"en_US": "US", "en_GB": "GB", "de_DE": "DE", "fr_FR": "FR", "es_ES": "ES",
           "it_IT": "IT", "pt_BR": "BR", "nl_NL": "NL", "ja_JP": "JP", "zh_CN": "CN",
           "hi_IN": "IN"}
DETECTORS = ("email", "card", "phone", "ssn", "iban", "ipv4", "aws_access_key",
             "aws_secret_key", "jwt", "bearer")
MASKS = {d: chr(0xE000 + i) for i, d in enumerate(DETECTORS)}
CJK = ("ja_JP", "zh_CN")

# label words a person writes before a value, per locale: (phone, e-mail, card, account)
LABELS = {
    "en_US": ("Phone", "Email", "Card", "Account"),
    "en_GB": ("Tel", "E-mail", "Card number", "Bank account"),
    "de_DE": ("Telefon", "E-Mail", "Kreditkarte", "Konto"),
    "fr_FR": ("Tél.", "Courriel", "Carte", "Compte"),
    "es_ES": ("Teléfono", "Correo", "Tarjeta", "Cuenta"),
    "it_IT": ("Telefono", "Email", "Carta", "Conto"),
    "pt_BR": ("Telefone", "E-mail", "Cartão", "Conta"),
    "nl_NL": ("Telefoon", "E-mail", "Creditcard", "Rekening"),
    "ja_JP": ("電話番号", "メール", "カード番号", "口座"),
    "zh_CN": ("电话", "邮箱", "银行卡", "账户"),
    "hi_IN": ("फ़ोन", "ईमेल", "कार्ड", "खाता"),
}
JSON_KEYS = {"email": "email", "phone": "phone", "card": "card_number", "iban": "iban",
             "ssn": "ssn", "ipv4": "client_ip"}


@dataclass
class Sample:
    """One record value: its text, the labelled values (detector, start, end) in it, and the
    locale it came from. No labels: a near-miss record that must stay as it is."""

    text: str
    labels: list[tuple[str, int, int]] = field(default_factory=list)
    locale: str = ""
    kind: str = ""


# --- values ------------------------------------------------------------------------------

def phone_numbers(rng: random.Random, locale: str, fake: Faker) -> str:
    """A phone number of the locale: Faker's formats, or a valid number from phonenumbers'
    metadata in one of its formats."""
    if rng.random() < 0.5:
        return str(fake.phone_number())
    region = REGIONS[locale]
    kind = rng.choice([phonenumbers.PhoneNumberType.FIXED_LINE,
                       phonenumbers.PhoneNumberType.MOBILE])
    example = phonenumbers.example_number_for_type(region, kind)
    assert example is not None
    national = str(example.national_number)
    for _ in range(50):
        tail = "".join(rng.choice(string.digits) for _ in range(4))
        candidate = phonenumbers.parse(f"+{example.country_code}{national[:-4]}{tail}")
        if phonenumbers.is_valid_number(candidate):
            break
    else:
        candidate = example
    fmt = rng.choice([phonenumbers.PhoneNumberFormat.NATIONAL,
                      phonenumbers.PhoneNumberFormat.INTERNATIONAL,
                      phonenumbers.PhoneNumberFormat.E164])
    return phonenumbers.format_number(candidate, fmt)


def card_number(rng: random.Random, fake: Faker) -> str:
    number = str(fake.credit_card_number())
    style = rng.random()
    if style < 0.5 or len(number) not in (16, 19):
        return number
    sep = " " if style < 0.8 else "-"
    return sep.join(number[i:i + 4] for i in range(0, len(number), 4))


def iban(rng: random.Random, fake: Faker) -> str:
    value = str(fake.iban())
    if rng.random() < 0.4:
        value = " ".join(value[i:i + 4] for i in range(0, len(value), 4))
    return value


def aws_key_id(rng: random.Random) -> str:
    return rng.choice(["AKIA", "ASIA"]) + "".join(
        rng.choice(string.ascii_uppercase + "234567") for _ in range(16))


def aws_secret(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits + "/+") for _ in range(40))


def session_token(rng: random.Random) -> str:
    return "IQoJb3JpZ2luX2Vj" + "".join(
        rng.choice(string.ascii_letters + string.digits + "/+")
        for _ in range(rng.randint(80, 300)))


def b64url(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(rng: random.Random, fake: Faker) -> str:
    header = b64url(json.dumps({"alg": "RS256", "typ": "JWT"}).encode())
    payload = b64url(json.dumps({"sub": fake.uuid4(), "name": fake.name(),
                                 "iat": rng.randint(1_600_000_000, 1_900_000_000)}).encode())
    return f"{header}.{payload}.{b64url(bytes(rng.randrange(256) for _ in range(64)))}"


# --- records -----------------------------------------------------------------------------

class Builder:
    """Joins text pieces, recording where the labelled ones land."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.labels: list[tuple[str, int, int]] = []
        self.length = 0

    def text(self, s: str) -> Builder:
        self.parts.append(s)
        self.length += len(s)
        return self

    def value(self, det: str, s: str) -> Builder:
        self.labels.append((det, self.length, self.length + len(s)))
        return self.text(s)

    def sample(self, locale: str, kind: str) -> Sample:
        return Sample("".join(self.parts), self.labels, locale, kind)


def sentence(fake: Faker) -> str:
    return str(fake.sentence(nb_words=6))


def in_text(rng: random.Random, fake: Faker, locale: str, det: str, value: str,
            label: str) -> Sample:
    cjk = locale in CJK
    b = Builder()
    style = rng.randrange(4)
    if style == 0:  # a label word, then the value, then more text
        b.text(f"{sentence(fake)} {label}: ").value(det, value).text(f" {sentence(fake)}")
    elif style == 1 and cjk:  # glued to the text around it, as CJK text is written
        b.text(f"{sentence(fake)}{label}").value(det, value).text(sentence(fake))
    elif style == 1:
        b.text(f"{label} ").value(det, value).text(f", {sentence(fake)}")
    elif style == 2:  # quoted as the locale quotes
        left, right = {"fr_FR": ("« ", " »"), "ja_JP": ("「", "」"), "zh_CN": ("“", "”"),
                       "de_DE": ("„", "“")}.get(locale, ("\"", "\""))
        if locale == "fr_FR" and rng.random() < 0.5:
            left, right = "«", "»"
        b.text(f"{label} {left}").value(det, value).text(f"{right} {sentence(fake)}")
    else:  # a line of a multi-line message
        b.text(f"{fake.name()}\n{fake.address()}\n{label}: ").value(det, value).text("\n")
    return b.sample(locale, f"text:{det}")


def in_json(rng: random.Random, fake: Faker, locale: str, det: str, value: str,
            key: str) -> Sample:
    """A JSON record (non-ASCII written as is) with the value under key; other members are
    generated (names, addresses, dates, sentences)."""
    marker = "\x00VALUE\x00"
    doc = {"id": fake.uuid4(), "name": fake.name(), "address": fake.address(),
           "created": fake.iso8601(end_datetime=END), key: marker, "note": sentence(fake)}
    if rng.random() < 0.3:
        doc = {"event": "signup", "user": doc, "count": rng.randint(1, 99)}
    text = json.dumps(doc, ensure_ascii=False)
    encoded = json.dumps(value, ensure_ascii=False)[1:-1]
    encoded_marker = json.dumps(marker)[1:-1]
    at = text.index(encoded_marker)
    assert encoded == value, value  # the corpus' values need no escapes
    return Sample(text.replace(encoded_marker, encoded), [(det, at, at + len(value))], locale,
                  f"json:{det}")


def credentials(rng: random.Random, fake: Faker, locale: str) -> Sample:
    """AWS credentials as the CLI, Terraform and Java properties write them."""
    key_id, secret = aws_key_id(rng), aws_secret(rng)
    b = Builder()
    style = rng.randrange(6)
    if style == 0:  # ~/.aws/credentials
        b.text("[default]\naws_access_key_id = ").value("aws_access_key", key_id)
        b.text("\naws_secret_access_key = ").value("aws_secret_key", secret).text("\n")
    elif style == 1:  # environment, as `aws configure export-credentials --format env` prints
        b.text("export AWS_ACCESS_KEY_ID=").value("aws_access_key", key_id)
        b.text("\nexport AWS_SECRET_ACCESS_KEY=").value("aws_secret_key", secret)
        token = session_token(rng)
        b.text("\nexport AWS_SESSION_TOKEN=").value("aws_secret_key", token).text("\n")
    elif style == 2:  # Terraform provider block
        b.text('provider "aws" {\n  region     = "eu-west-1"\n  access_key = "')
        b.value("aws_access_key", key_id).text('"\n  secret_key = "')
        b.value("aws_secret_key", secret).text('"\n}\n')
    elif style == 3:  # Java properties (SDK system properties, Spring Cloud AWS)
        if rng.random() < 0.5:
            b.text("aws.accessKeyId=").value("aws_access_key", key_id)
            b.text("\naws.secretKey=").value("aws_secret_key", secret).text("\n")
        else:
            b.text("cloud.aws.credentials.access-key=").value("aws_access_key", key_id)
            b.text("\ncloud.aws.credentials.secret-key=").value("aws_secret_key", secret)
            b.text("\n")
    elif style == 4:  # `aws sts assume-role` output, inside a JSON record
        token = session_token(rng)
        b.text('{"Credentials": {"AccessKeyId": "').value("aws_access_key", key_id)
        b.text('", "SecretAccessKey": "').value("aws_secret_key", secret)
        b.text('", "SessionToken": "').value("aws_secret_key", token)
        b.text(f'", "Expiration": "{fake.iso8601(end_datetime=END)}+00:00"}}}}')
    else:  # a chat message pasting the env lines
        b.text(f"{sentence(fake)} AWS_ACCESS_KEY_ID=").value("aws_access_key", key_id)
        b.text(" AWS_SECRET_ACCESS_KEY=").value("aws_secret_key", secret)
    return b.sample(locale, "credentials")


def positives(rng: random.Random, fake: Faker, locale: str, per_type: int) -> list[Sample]:
    phone_l, mail_l, card_l, account_l = LABELS[locale]
    out: list[Sample] = []

    def add(det: str, value: str, label: str) -> None:
        if rng.random() < 0.35 and det in JSON_KEYS:
            out.append(in_json(rng, fake, locale, det, value, JSON_KEYS[det]))
        else:
            out.append(in_text(rng, fake, locale, det, value, label))

    for _ in range(per_type):
        add("email", str(rng.choice([fake.email(), fake.free_email(), fake.company_email()])),
            mail_l)
        add("phone", phone_numbers(rng, locale, fake), phone_l)
        add("card", card_number(rng, fake), card_l)
        add("iban", iban(rng, fake), account_l)
        add("ipv4", str(rng.choice([fake.ipv4_public(), fake.ipv4_private()])), "IP")
        out.append(credentials(rng, fake, locale))
        if rng.random() < 0.3:
            b = Builder().text(f"{sentence(fake)}\nAuthorization: Bearer ")
            out.append(b.value("jwt", jwt(rng, fake)).text("\n").sample(locale, "jwt"))
            token = "".join(rng.choice(string.ascii_letters + string.digits + "-._~")
                            for _ in range(rng.randint(20, 48)))
            b = Builder().text("curl -H 'Authorization: Bearer ")
            out.append(b.value("bearer", token).text(f"' {fake.url()}").sample(locale, "bearer"))
    if locale == "en_US":
        for _ in range(per_type * 3):
            add("ssn", str(fake.ssn()), rng.choice(["SSN", "Social Security number"]))
    return out


# --- near-misses -------------------------------------------------------------------------

def luhn_digit(body: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(body)):
        d = int(ch)
        if i % 2 == 0:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return str((10 - total % 10) % 10)


def near_miss_values(rng: random.Random, fake: Faker, locale: str) -> list[tuple[str, str]]:
    """(kind, text) pairs that no detector may mask."""
    out: list[tuple[str, str]] = []
    for _ in range(3):  # a Luhn-valid card number inside a longer digit run
        card = str(fake.credit_card_number())
        while True:  # the whole run must not be card-shaped itself (19 digits or fewer, Luhn)
            before = "".join(rng.choice(string.digits) for _ in range(rng.randint(1, 4)))
            after = "".join(rng.choice(string.digits) for _ in range(rng.randint(0, 3)))
            run = before + card + after
            if len(run) > 19 or luhn_digit(run[:-1]) != run[-1]:
                break
        out.append(("luhn-inside", run))
    for _ in range(3):  # an IBAN whose check digits fail
        value = str(fake.iban())
        bad = f"{(int(value[2:4]) + rng.randint(1, 96)) % 97:02d}"
        if bad == value[2:4] or bad in ("00", "01"):
            bad = "50" if value[2:4] != "50" else "51"
        value = value[:2] + bad + value[4:]
        if rng.random() < 0.5:
            value = " ".join(value[i:i + 4] for i in range(0, len(value), 4))
        out.append(("iban-bad-check", value))
    for _ in range(3):
        pattern = rng.choice(["%Y-%m-%d", "%d.%m.%Y", "%d/%m/%Y", "%m/%d/%Y", "%Y年%m月%d日",
                              "%d-%m-%Y", "%Y%m%d"])
        out.append(("date", fake.date(pattern=pattern, end_datetime=END)))
        out.append(("datetime", fake.iso8601(end_datetime=END)))
    for _ in range(3):
        out.append(("order", rng.choice([
            f"ORD-{rng.randint(2015, 2030)}-{rng.randint(0, 999999):06d}",
            f"#{rng.randint(100000, 99999999)}",
            f"PO {rng.randint(4500000000, 4599999999)}",
            f"{rng.randint(100, 999)}-{rng.randint(1000000, 9999999)}"
            f"-{rng.randint(1000000, 9999999)}",
            fake.bothify("??-######-##").upper(),
        ])))
    for _ in range(3):
        out.append(("uuid", str(fake.uuid4())))
    for _ in range(3):
        out.append(("version", rng.choice([
            f"{rng.randint(0, 20)}.{rng.randint(0, 30)}.{rng.randint(0, 99)}",
            f"v{rng.randint(0, 9)}.{rng.randint(0, 20)}.{rng.randint(0, 20)}"
            f"-rc.{rng.randint(1, 5)}",
            f"10.0.{rng.randint(19000, 26000)}.{rng.randint(1000, 5000)}",
            f"{rng.randint(1, 4)}.{rng.randint(0, 9)}.{rng.randint(0, 9)}"
            f"+build.{rng.randint(1, 999)}",
        ])))
    for _ in range(3):
        amount = rng.randint(100, 9999999) / 100
        out.append(("price", rng.choice([
            f"${amount:,.2f}", f"{amount:,.2f} €".replace(",", "X").replace(".", ",")
            .replace("X", "."), f"£{amount:,.2f}", f"¥{int(amount * 100):,}",
            f"R$ {amount:,.2f}".replace(",", "X").replace(".", ",").replace("X", "."),
            f"₹{amount:,.2f}", f"{amount:.2f} EUR"])))
    return out


def near_misses(rng: random.Random, fake: Faker, locale: str) -> list[Sample]:
    out: list[Sample] = []
    for kind, value in near_miss_values(rng, fake, locale):
        style = rng.randrange(3)
        if style == 0:
            text = f"{sentence(fake)} {value} {sentence(fake)}"
        elif style == 1 and locale in CJK:
            text = f"{sentence(fake)}{value}{sentence(fake)}"
        else:
            text = json.dumps({"id": fake.uuid4(), "name": fake.name(), kind: value,
                               "note": sentence(fake)}, ensure_ascii=False)
        out.append(Sample(text, [], locale, f"near:{kind}"))
    return out


def build_corpus(seed: int = SEED, per_type: int = 12) -> list[Sample]:
    samples: list[Sample] = []
    for n, locale in enumerate(LOCALES):
        rng = random.Random(seed * 100 + n)
        fake = Faker(locale)
        fake.seed_instance(seed * 100 + n)
        samples += positives(rng, fake, locale, per_type)
        for _ in range(per_type // 3):
            samples += near_misses(rng, fake, locale)
    return samples


# --- evaluation --------------------------------------------------------------------------

def marker_filter() -> LoadedFilter:
    detectors = {d: {"mask": MASKS[d]} for d in DETECTORS}
    spec = FilterSpec(name="pii-locale-corpus", module="builtin:pii-mask",
                      config={"mode": "auto", "preserve_format": False, "detectors": detectors})
    return load_filter(spec)


@dataclass
class Result:
    found: Counter[str] = field(default_factory=Counter)
    total: Counter[str] = field(default_factory=Counter)
    kept: Counter[str] = field(default_factory=Counter)
    near: Counter[str] = field(default_factory=Counter)
    spill: int = 0
    misses: list[tuple[str, str, str]] = field(default_factory=list)
    changed: list[tuple[str, str]] = field(default_factory=list)

    def recall(self, det: str) -> float:
        return self.found[det] / self.total[det] if self.total[det] else 1.0

    def keep(self) -> float:
        return sum(self.kept.values()) / max(1, sum(self.near.values()))


def masked_by(original: str, masked: str) -> list[str | None]:
    """Per character of original: the detector that masked it, or None."""
    if len(masked) != len(original):
        raise AssertionError(f"masked text does not line up: {original!r} -> {masked!r}")
    owner = {m: d for d, m in MASKS.items()}
    out: list[str | None] = []
    for a, b in zip(original, masked, strict=True):
        if a == b:
            out.append(None)
        elif b in owner:
            out.append(owner[b])
        else:
            raise AssertionError(f"unmasked text changed: {original!r} -> {masked!r}")
    return out


def evaluate(samples: list[Sample]) -> Result:
    f = marker_filter()
    ctx = RecordContext(topic="corpus", partition=0, direction="produce")
    recs = [FilterRecord(i, 0, None, s.text.encode(), []) for i, s in enumerate(samples)]
    decisions = f.run_batch(ctx, recs).decisions
    f.close()
    res = Result()
    for sample, decision in zip(samples, decisions, strict=True):
        masked = decision.value.decode() if decision.value is not None else sample.text
        by = masked_by(sample.text, masked)
        if not sample.labels:
            kind = sample.kind.split(":", 1)[1]
            res.near[kind] += 1
            if masked == sample.text:
                res.kept[kind] += 1
            else:
                res.changed.append((sample.text, masked))
            continue
        inside = [False] * len(sample.text)
        for det, start, end in sample.labels:
            for i in range(start, end):
                inside[i] = True
            value = sample.text[start:end]
            want = [i for i in range(start, end)
                    if (sample.text[i].isdigit() if det == "phone" else sample.text[i].isalnum())]
            res.total[det] += 1
            if all(by[i] == det for i in want):
                res.found[det] += 1
            else:
                res.misses.append((det, value, sample.text))
        res.spill += sum(1 for i, d in enumerate(by) if d is not None and not inside[i])
    return res


def report(res: Result) -> str:
    lines = [f"{'detector':16} {'found':>6} {'total':>6} {'recall':>7}"]
    for det in DETECTORS:
        lines.append(f"{det:16} {res.found[det]:6} {res.total[det]:6} {res.recall(det):7.3f}")
    lines.append(f"{'near-miss':16} {sum(res.kept.values()):6} {sum(res.near.values()):6} "
                 f"{res.keep():7.3f}  (kept / records; "
                 + ", ".join(f"{k} {res.kept[k]}/{res.near[k]}" for k in sorted(res.near)) + ")")
    lines.append(f"characters masked outside labelled values in positive records: {res.spill}")
    return "\n".join(lines)


def main() -> None:
    import sys

    samples = build_corpus()
    res = evaluate(samples)
    print(f"corpus: {len(samples)} records, {sum(res.total.values())} labelled values, "
          f"{sum(res.near.values())} near-miss records, {len(LOCALES)} locales")
    print(report(res))
    if "-v" in sys.argv:
        for det, value, text in res.misses:
            print(f"MISS {det}: {value!r} in {text!r}")
        for text, masked in res.changed:
            print(f"CHANGED {text!r} -> {masked!r}")


if __name__ == "__main__":
    main()
