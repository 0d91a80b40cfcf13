"""builtin:pii-mask on an independent multi-locale corpus (pii_locale_corpus.py): values from
Faker and phonenumbers in eleven locales, in sentences and JSON, plus near-misses.

Targets (issue 29): recall >= 0.97 for every detector, keep-rate >= 0.99 on the near-misses,
and nothing masked outside the labelled values. Before the detectors were reworked the same
corpus measured phone 0.765, AWS secret key 0.476, e-mail 0.917, card 0.864, IBAN 0.909,
IPv4 0.962 (keep 0.993). The second seed is one the detectors were not tuned on.
"""

from __future__ import annotations

import pytest

from tests.filters.builtin.pii_locale_corpus import (
    DETECTORS,
    LOCALES,
    SEED,
    build_corpus,
    evaluate,
    report,
)


@pytest.mark.parametrize("seed", [SEED, 7])
def test_recall_and_keep_targets(seed: int) -> None:
    samples = build_corpus(seed=seed)
    assert {s.locale for s in samples} == set(LOCALES)
    res = evaluate(samples)
    table = report(res)
    print(table)
    for det in DETECTORS:
        assert res.total[det] >= 30, (det, table)
        assert res.recall(det) >= 0.97, (det, table, [m for m in res.misses if m[0] == det][:5])
    assert sum(res.near.values()) >= 1000
    assert res.keep() >= 0.99, (table, res.changed[:5])
    assert res.spill == 0, table


def test_the_corpus_is_reproducible() -> None:
    a, b = build_corpus(per_type=2), build_corpus(per_type=2)
    assert [(s.text, s.labels) for s in a] == [(s.text, s.labels) for s in b]
