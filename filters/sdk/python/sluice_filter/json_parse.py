"""A strict JSON parser with the C, Go and Rust SDKs' grammar and error messages, so that a
Python port of a filter rejects the same values with the same reasons.

`parse_json(data)` returns Python values (dict, list, str, bool, None, and numbers as their
text in a `Number`); `JSONError.message` is one of the SDKs' messages ("unexpected end of
input", "bad number", "expected ',' or '}'", ...). Objects keep the first of duplicate names.
Nesting deeper than 64 is refused; a lone surrogate escape becomes U+FFFD.
"""

from __future__ import annotations

from typing import Any

__all__ = ["JSONError", "Number", "parse_json"]

MAX_DEPTH = 64
_WS = b" \t\n\r"
_DIGITS = b"0123456789"
_ESCAPES = {34: '"', 92: "\\", 47: "/", 98: "\b", 102: "\f", 110: "\n", 114: "\r", 116: "\t"}


class JSONError(ValueError):
    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset


class Number(str):
    """A JSON number, kept as its text."""


class _Parser:
    __slots__ = ("depth", "i", "s")

    def __init__(self, s: bytes) -> None:
        self.s = s
        self.i = 0
        self.depth = 0

    def fail(self, message: str) -> JSONError:
        return JSONError(message, self.i)

    def ws(self) -> None:
        s, i, n = self.s, self.i, len(self.s)
        while i < n and s[i] in _WS:
            i += 1
        self.i = i

    def hex4(self, at: int) -> int | None:
        chunk = self.s[at:at + 4]
        if len(chunk) < 4 or any(c not in b"0123456789abcdefABCDEF" for c in chunk):
            return None
        return int(chunk, 16)

    def utf8_len(self, at: int) -> int:
        c = self.s[at]
        if c <= 0x7F:
            return 1
        if 0xC2 <= c <= 0xDF:
            n = 2
        elif 0xE0 <= c <= 0xEF:
            n = 3
        elif 0xF0 <= c <= 0xF4:
            n = 4
        else:
            return 0
        try:
            self.s[at:at + n].decode("utf-8")
        except UnicodeDecodeError:
            return 0
        return n if at + n <= len(self.s) else 0

    def string(self) -> str:
        s = self.s
        self.i += 1
        out = bytearray()
        while True:
            if self.i >= len(s):
                raise self.fail("unterminated string")
            c = s[self.i]
            if c == 34:
                self.i += 1
                return out.decode("utf-8")
            if c < 0x20:
                raise self.fail("control character in string")
            if c == 92:
                if self.i + 1 >= len(s):
                    raise self.fail("bad escape")
                e = s[self.i + 1]
                if e != 117:
                    lit = _ESCAPES.get(e)
                    if lit is None:
                        raise self.fail("bad escape")
                    out += lit.encode()
                    self.i += 2
                    continue
                cp = self.hex4(self.i + 2)
                if cp is None:
                    raise self.fail("bad \\u escape")
                self.i += 6
                if 0xD800 <= cp <= 0xDBFF:
                    lo = None
                    if s[self.i:self.i + 2] == b"\\u":
                        lo = self.hex4(self.i + 2)
                    if lo is not None and 0xDC00 <= lo <= 0xDFFF:
                        self.i += 6
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                    else:
                        cp = 0xFFFD
                elif 0xDC00 <= cp <= 0xDFFF:
                    cp = 0xFFFD
                out += chr(cp).encode("utf-8")
                continue
            n = self.utf8_len(self.i)
            if n == 0:
                raise self.fail("invalid UTF-8")
            out += s[self.i:self.i + n]
            self.i += n

    def number(self) -> Number:
        s, start = self.s, self.i
        q, n = start, len(s)
        if q < n and s[q] == 45:
            q += 1
        if q >= n:
            raise self.fail("bad number")
        if s[q] == 48:
            q += 1
        elif s[q] in _DIGITS:
            while q < n and s[q] in _DIGITS:
                q += 1
        else:
            raise self.fail("bad number")
        if q < n and s[q] == 46:
            q += 1
            if not (q < n and s[q] in _DIGITS):
                raise self.fail("bad number")
            while q < n and s[q] in _DIGITS:
                q += 1
        if q < n and s[q] in b"eE":
            q += 1
            if q < n and s[q] in b"+-":
                q += 1
            if not (q < n and s[q] in _DIGITS):
                raise self.fail("bad number")
            while q < n and s[q] in _DIGITS:
                q += 1
        self.i = q
        return Number(s[start:q].decode())

    def literal(self, lit: bytes, value: Any) -> Any:
        if self.s[self.i:self.i + len(lit)] == lit:
            self.i += len(lit)
            return value
        raise self.fail("unexpected token")

    def value(self) -> Any:
        self.ws()
        s = self.s
        if self.i >= len(s):
            raise self.fail("unexpected end of input")
        c = s[self.i]
        if c in (123, 91):  # { [
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise self.fail("nesting too deep")
            obj = c == 123
            closer = 125 if obj else 93
            members: dict[str, Any] = {}
            items: list[Any] = []
            self.i += 1
            self.ws()
            if self.i < len(s) and s[self.i] == closer:
                self.i += 1
            else:
                while True:
                    self.ws()
                    name = ""
                    if obj:
                        if self.i >= len(s) or s[self.i] != 34:
                            raise self.fail("expected member name")
                        name = self.string()
                        self.ws()
                        if self.i >= len(s) or s[self.i] != 58:
                            raise self.fail("expected ':'")
                        self.i += 1
                    item = self.value()
                    if obj:
                        members.setdefault(name, item)
                    else:
                        items.append(item)
                    self.ws()
                    if self.i >= len(s):
                        raise self.fail("unexpected end of input")
                    x = s[self.i]
                    if x == 44:
                        self.i += 1
                        continue
                    if x == closer:
                        self.i += 1
                        break
                    raise self.fail("expected ',' or '}'" if obj else "expected ',' or ']'")
            self.depth -= 1
            return members if obj else items
        if c == 34:
            return self.string()
        if c == 45 or c in _DIGITS:
            return self.number()
        if c == 116:
            return self.literal(b"true", True)
        if c == 102:
            return self.literal(b"false", False)
        if c == 110:
            return self.literal(b"null", None)
        raise self.fail("unexpected character")


def parse_json(data: bytes) -> Any:
    """The value of `data` (JSONError with the SDKs' message when it is not JSON)."""
    p = _Parser(bytes(data))
    v = p.value()
    p.ws()
    if p.i != len(p.s):
        raise p.fail("trailing characters after JSON value")
    return v
