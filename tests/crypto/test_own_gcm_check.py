"""The known-answer check that admits crypto/batch_seal.c's own AES-256-GCM (`own_gcm_check`)
must catch a fault in any branch the module later runs: a copy of the C file with one branch
broken (a GHASH power, a counter, the length block, the tag comparison) is compiled with a
small driver that prints the check's answer, which must be 0, and whether a call then runs on
OpenSSL's EVP, which it must; the unbroken copy answers 1 and runs its own code.

Each mutation is a fault the check once let through or one of the branches it must keep
covering: the four-block step of the prefix hash (prefixes of 4..7 blocks past a multiple
of eight), counters past the fourth round of eight, a length block with bit 15 set (4 096
bytes), a comparison that skipped the tag's first byte."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "crypto" / "batch_seal.c"
CC = shutil.which("cc") or shutil.which("gcc")


def _cpu_has_aes_ni() -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])
    return {"aes", "pclmulqdq", "ssse3", "sse4_1"} <= set(flags)


pytestmark = pytest.mark.skipif(
    CC is None or platform.machine() not in ("x86_64", "AMD64") or not _cpu_has_aes_ni(),
    reason="needs a C compiler and an x86-64 CPU with AES-NI and PCLMULQDQ")

DRIVER = """
#include "batch_seal_copy.c"
#include <stdio.h>
int main(void) {
    /* the check's answer, then whether a call's context then runs on EVP */
    static const uint8_t key[32] = {5};
    gcm_t g = {0};
    int check = own_gcm_check();
    if (gcm_new(&g, 1, key)) return 2;
    int evp = g.own == NULL && g.ctx != NULL;
    gcm_done(&g, 0);
    printf("%d %d\\n", check, evp);
    return 0;
}
"""

#: name -> (text in batch_seal.c, its broken replacement)
MUTATIONS: dict[str, tuple[str, str]] = {
    "prefix hash, four-block step": (
        "og_clmul(_mm_xor_si128(x, OG_LOAD(0)), k->hp[3], &lo, &hi);",
        "og_clmul(_mm_xor_si128(x, OG_LOAD(0)), k->hp[2], &lo, &hi);"),
    "prefix hash, eight-block step": ("OG_ADD(7, 0)", "OG_ADD(7, 1)"),
    "prefix hash, single blocks": (
        "x = og_mul(_mm_xor_si128(x, OG_LOAD(0)), k->hp[0]);",
        "x = og_mul(_mm_xor_si128(x, OG_LOAD(0)), k->hp[1]);"),
    "prefix's partial block completed by the rest": (
        "memset(head + pre->n + t, 0, 16 - pre->n - t);",
        "memset(head + pre->n + t, 1, 16 - pre->n - t);"),
    "counter mode, partial last block": (
        "out[j] = in[j] ^ t[j];", "out[j] = in[j] ^ t[j] ^ (uint8_t)(j == 14);"),
    "counter mode, rounds past the fourth": (
        "ctr += 8;", "ctr += 8; if (ctr > 24) ctr++;"),
    "message hash, 16-block runs": (
        "size_t m = total < OG_POWERS ? total : OG_POWERS;",
        "size_t m = total < OG_POWERS ? total : OG_POWERS;"
        " if (m == OG_POWERS) x = _mm_xor_si128(x, _mm_set_epi32(0, 0, 0, 1));"),
    "length block, bit 15 of the text's bits": (
        "lens[8 + i] = (uint8_t)(c >> (56 - 8 * i));",
        "lens[8 + i] = (uint8_t)((c & ~0x8000ULL) >> (56 - 8 * i));"),
    "tag comparison skips the first byte": (
        "CRYPTO_memcmp(tag, ct + len, TAG)", "CRYPTO_memcmp(tag + 1, ct + len + 1, TAG - 1)"),
    "tag comparison of the last byte only": (
        "CRYPTO_memcmp(tag, ct + len, TAG)", "CRYPTO_memcmp(tag + 15, ct + len + 15, 1)"),
    # the shared associated data of key-less, header-less records (gcm_shared_aad): its
    # state one block short of its length, and a null key written as an empty one (a
    # message whose AAD is not aad_for's for such a record, yet seals and opens itself)
    "shared AAD's state one block short": (
        "gcm_prefix(g0, scratch, n);", "gcm_prefix(g0, scratch, n - 16); g0->pre_len = n;"),
    "shared AAD with an empty key for a null one": (
        "aad_tail_of(scratch + prefix_len, NULL, -1, no_headers)",
        "aad_tail_of(scratch + prefix_len, NULL, 0, no_headers)"),
}


def _check_answer(tmp_path: Path, source: str) -> str:
    (tmp_path / "batch_seal_copy.c").write_text(source)
    (tmp_path / "driver.c").write_text(DRIVER)
    exe = tmp_path / "driver"
    assert CC is not None
    subprocess.run([CC, "-O1", "-w", "-o", str(exe), str(tmp_path / "driver.c"), "-lcrypto"],
                   check=True, capture_output=True, timeout=120)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True,
                          timeout=60).stdout.strip()


def test_the_unbroken_code_passes_its_check(tmp_path: Path) -> None:
    assert _check_answer(tmp_path, SOURCE.read_text()) == "1 0"


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_broken_branch_fails_the_check(tmp_path: Path, name: str) -> None:
    text = SOURCE.read_text()
    old, new = MUTATIONS[name]
    assert text.count(old) == 1, f"the mutation's text is no longer in batch_seal.c: {old!r}"
    # the check fails and the call's messages go through OpenSSL's EVP
    assert _check_answer(tmp_path, text.replace(old, new)) == "0 1"


SANITIZED_DRIVER = """
#include "batch_seal_copy.c"
#include <stdio.h>
int main(void) {
    static const uint8_t key[32] = {1, 2, 3};
    uint8_t aad[300], pt[300], ct[300 + TAG], back[300], nonce[NONCE] = {9};
    for (int i = 0; i < 300; i++) aad[i] = pt[i] = (uint8_t)i;
    int ok = own_gcm_check();
    for (size_t pre = 0; ok && pre < 40; pre += 13) {
        gcm_t seal = {0}, open = {0};
        if (gcm_new(&seal, 1, key) || gcm_new(&open, 0, key)) return 2;
        gcm_prefix(&seal, aad, pre);
        gcm_prefix(&open, aad, pre);
        for (size_t n = 0; ok && n < 300; n += 37) {
            if (gcm_seal(&seal, nonce, aad, pre + 5, pt, n, ct) ||
                gcm_open(&open, nonce, aad, pre + 5, ct, n, back) || memcmp(back, pt, n))
                ok = 0;
        }
        gcm_done(&seal, 0);
        gcm_done(&open, 0);
    }
    printf("%d\\n", ok);
    return 0;
}
"""


def test_the_check_and_the_calls_are_clean_under_sanitizers(tmp_path: Path) -> None:
    """The check and a call's set-up (gcm_new starts each call's GHASH from an empty
    prefix), sealing and opening run under AddressSanitizer and UndefinedBehaviorSanitizer
    with no report (a report stops the program)."""
    (tmp_path / "batch_seal_copy.c").write_text(SOURCE.read_text())
    (tmp_path / "driver.c").write_text(SANITIZED_DRIVER)
    exe = tmp_path / "driver"
    assert CC is not None
    built = subprocess.run([CC, "-O1", "-g", "-w", "-fsanitize=address,undefined",
                            "-fno-sanitize-recover=undefined", "-o", str(exe),
                            str(tmp_path / "driver.c"), "-lcrypto"],
                           capture_output=True, timeout=120)
    if built.returncode:
        pytest.skip("the compiler has no sanitizer runtime")
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                         env={"ASAN_OPTIONS": "detect_leaks=0"})
    assert (ran.returncode, ran.stdout.strip()) == (0, "1"), ran.stderr[-2000:]


LENGTH_DRIVER = """
#include "batch_seal_copy.c"
#include <stdio.h>
int main(int argc, char **argv) {
    static const uint8_t key[32] = {1, 2, 3};
    static uint8_t buf[64], nonce[NONCE];
    int open = argc > 1;
    gcm_t g = {0};
    if (gcm_new(&g, !open, key)) return 2;
    /* 2^31 bytes: past EVP's int and within a block of the counter's reach at 2^36 */
    size_t huge = (size_t)1 << 31, aad_huge = (size_t)1 << 31;
    int a = open ? gcm_open(&g, nonce, buf, 1, buf, huge, buf)
                 : gcm_seal(&g, nonce, buf, 1, buf, huge, buf);
    int b = open ? gcm_open(&g, nonce, buf, aad_huge, buf, 1, buf)
                 : gcm_seal(&g, nonce, buf, aad_huge, buf, 1, buf);
    gcm_done(&g, 0);
    printf("%d %d\\n", a, b);
    return 0;
}
"""


@pytest.mark.parametrize("direction", ["seal", "open"])
def test_messages_too_long_for_gcm_are_refused_before_any_byte_is_read(
        tmp_path: Path, direction: str) -> None:
    """A text or associated data of 2^31 bytes (buffers of 64: nothing past them may be
    touched) is refused with -1 by both directions of the own code, never sealed with a
    length EVP's int truncates or a counter that wraps onto the tag's mask."""
    (tmp_path / "batch_seal_copy.c").write_text(SOURCE.read_text())
    (tmp_path / "driver.c").write_text(LENGTH_DRIVER)
    exe = tmp_path / "driver"
    assert CC is not None
    subprocess.run([CC, "-O1", "-w", "-o", str(exe), str(tmp_path / "driver.c"), "-lcrypto"],
                   check=True, capture_output=True, timeout=120)
    ran = subprocess.run([str(exe), *(["open"] if direction == "open" else [])],
                         capture_output=True, text=True, timeout=60)
    assert (ran.returncode, ran.stdout.strip()) == (0, "-1 -1")
