"""Structural pre-check of a message body before kio's compiled reader sees it.

Why: kio 0.6.5's native reader reserves memory for an array from its declared element count
before reading any element. A hostile or corrupt frame that declares billions of elements
(for example a compact-array length of 2**32) makes that reservation fail, and Rust aborts the
whole process: no exception, the proxy dies. So every body is first walked here, following
the same kio schema, checking only lengths: each array's count times the smallest possible
element size must fit in the bytes that remain. The walk reads integers with struct and
skips strings/bytes by their length; it builds no objects.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from .errors import DecodeError

__all__ = ["check_body", "entity_skipper", "fields_end", "prepare", "read_uvarint", "skip_tags"]

# (buffer, position, end) -> new position
_Scan = Callable[[Any, int, int], int]

_FIXED: dict[str, int] = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}

_i16 = struct.Struct(">h").unpack_from
_i32 = struct.Struct(">i").unpack_from


def check_body(entity_type: type[Any], body: Any) -> None:
    """Raise DecodeError if `body` declares an array larger than the bytes it holds.

    Bodies that pass may still be invalid; kio reports those as ordinary errors.
    """
    end = len(body)
    try:
        _entity_scanner(entity_type)[0](body, 0, end)
    except (IndexError, struct.error):
        raise DecodeError("body truncated") from None


def prepare(entity_type: type[Any]) -> None:
    """Generate the scanners `check_body` and `fields_end` use for `entity_type` now rather
    than on first use."""
    _entity_scanner(entity_type)
    if entity_type not in _field_scanners:
        _field_scanners[entity_type] = _build_entity_scanner(entity_type, False)[0]


_field_scanners: dict[object, _Scan] = {}


def entity_skipper(entity_type: type[Any]) -> Callable[[Any, int, int], int]:
    """A function (buf, pos, end) -> the offset just past one encoded `entity_type` that
    starts at `pos`, its arrays checked as in `check_body`. It raises DecodeError, IndexError
    or struct.error on a truncated buffer (callers turn the last two into DecodeError)."""
    return _entity_scanner(entity_type)[0]


def fields_end(entity_type: type[Any], body: Any) -> int:
    """Offset in `body` where its top-level tagged-field section starts.

    Every regular field is walked as in `check_body` (arrays checked, no objects built); the
    top-level tagged fields are not read. A flexible body whose result is ``len(body) - 1``
    and whose last byte is 0 carries no top-level tagged field: the proxy uses this to skip
    decoding Produce/Fetch responses whose KIP-951 ``node_endpoints`` (a tagged field) are
    absent.
    """
    scan = _field_scanners.get(entity_type)
    if scan is None:
        scan = _field_scanners[entity_type] = _build_entity_scanner(entity_type, False)[0]
    try:
        return scan(body, 0, len(body))
    except (IndexError, struct.error):
        raise DecodeError("body truncated") from None


def read_uvarint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the unsigned varint at `pos`; DecodeError when it runs
    past `end` or is longer than 5 bytes."""
    if pos >= end:
        raise DecodeError("body truncated inside a varint")
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            raise DecodeError("body truncated inside a varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise DecodeError("varint longer than 5 bytes")


def skip_tags(buf: Any, pos: int, end: int) -> int:
    """The position after the tagged-field section at `pos`, whatever its tags (DecodeError
    when it runs past `end`)."""
    count, pos = read_uvarint(buf, pos, end)
    if count > end - pos:
        raise DecodeError(f"{count} tagged fields declared in {end - pos} bytes")
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos, end)
        size, pos = read_uvarint(buf, pos, end)
        pos += size
        if pos > end:
            raise DecodeError("tagged field runs past the end of the body")
    return pos


_scanners: dict[object, tuple[_Scan, int]] = {}


def _entity_scanner(entity_type: type[Any]) -> tuple[_Scan, int]:
    """(scanner, minimum encoded size) for an entity type."""
    found = _scanners.get(entity_type)
    if found is None:
        found = _scanners[entity_type] = _build_entity_scanner(entity_type)
    return found


def _build_entity_scanner(entity_type: type[Any], tags: bool = True) -> tuple[_Scan, int]:
    """Generate a scanner function for one entity type (`tags` False: stop before its own
    tagged-field section).

    The scanner is generated as Python source with every field inlined (fixed-size runs
    folded into one addition, one-byte varints read without a call) because a function call
    per field made the walk several times slower than kio's own decode on responses with
    many partitions. Tagged fields, which are rare, go through the closure scanners.
    """
    flexible = bool(entity_type.__flexible__)
    namespace: dict[str, Any] = {
        "uv": read_uvarint,
        "i16": _i16,
        "i32": _i32,
        "DecodeError": DecodeError,
        "scan_tags": _tag_scanner(entity_type),
    }
    lines: list[str] = []
    min_size = 1 if flexible else 0
    fixed_run = 0

    def flush() -> None:
        nonlocal fixed_run
        if fixed_run:
            lines.append(f"pos += {fixed_run}")
            fixed_run = 0

    for index, fld in enumerate(fields(entity_type)):
        if get_field_tag(fld) is not None:
            continue
        field_class = classify_field(fld)
        if isinstance(field_class, PrimitiveField):
            kafka_type = get_schema_field_type(fld)
            fixed = _FIXED.get(kafka_type)
            if fixed is not None:
                fixed_run += fixed
                min_size += fixed
                continue
            flush()
            lines += _skip_variable(kafka_type, flexible)
            min_size += 1 if flexible else (2 if kafka_type == "string" else 4)
        elif isinstance(field_class, EntityField):
            flush()
            sub = f"sub{index}"
            namespace[sub] = _entity_scanner(field_class.type_)[0]
            if is_optional(fld):
                lines += [
                    "if buf[pos] == 0xFF:",
                    "    pos += 1",
                    "else:",
                    f"    pos = {sub}(buf, pos + 1, end)",
                ]
                min_size += 1
            else:
                lines.append(f"pos = {sub}(buf, pos, end)")
                min_size += _entity_scanner(field_class.type_)[1]
        else:
            flush()
            lines += _read_count(flexible)
            if isinstance(field_class, PrimitiveTupleField):
                kafka_type = get_schema_field_type(fld)
                fixed = _FIXED.get(kafka_type)
                item_min = fixed or (1 if flexible else (2 if kafka_type == "string" else 4))
                body = (
                    [f"pos += n * {fixed}"]
                    if fixed is not None
                    else ["for _ in range(n):", *_indent(_skip_variable(kafka_type, flexible))]
                )
            elif isinstance(field_class, EntityTupleField):
                sub = f"sub{index}"
                namespace[sub], item_min = _entity_scanner(field_class.type_)
                body = ["for _ in range(n):", f"    pos = {sub}(buf, pos, end)"]
            else:  # pragma: no cover
                raise DecodeError(f"unsupported field {fld.name}")
            lines += [
                "if n > 0:",
                f"    if n * {item_min} > end - pos:",
                '        raise DecodeError(f"array of {n} items declared in {end - pos} bytes")',
                *_indent(body),
            ]
            min_size += 1 if flexible else 4
    flush()
    if flexible and tags:
        lines += [
            "count = buf[pos]",
            "if count < 0x80:",
            "    pos += 1",
            "else:",
            "    count, pos = uv(buf, pos, end)",
            "if count:",
            "    pos = scan_tags(buf, pos, end, count)",
        ]
    lines += [
        "if pos > end:",
        '    raise DecodeError("body truncated")',
        "return pos",
    ]
    source = "def scan(buf, pos, end):\n" + "\n".join(_indent(lines)) + "\n"
    exec(compile(source, f"<guard {entity_type.__qualname__}>", "exec"), namespace)
    return namespace["scan"], max(min_size, 1)


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line for line in lines]


def _read_count(flexible: bool) -> list[str]:
    if flexible:
        return [
            "n = buf[pos]",
            "if n < 0x80:",
            "    pos += 1",
            "else:",
            "    n, pos = uv(buf, pos, end)",
            "n -= 1",
        ]
    return ["n = i32(buf, pos)[0]", "pos += 4"]


def _skip_variable(kafka_type: str, flexible: bool) -> list[str]:
    """Source that skips one string/bytes/records value."""
    if kafka_type not in ("string", "bytes", "records"):
        raise DecodeError(f"unknown kafka type {kafka_type}")  # pragma: no cover
    if flexible:
        return [
            "n = buf[pos]",
            "if n < 0x80:",
            "    pos += n if n else 1",
            "else:",
            "    n, pos = uv(buf, pos, end)",
            "    pos += n - 1",
        ]
    reader = "i16" if kafka_type == "string" else "i32"
    width = 2 if kafka_type == "string" else 4
    return [f"n = {reader}(buf, pos)[0]", f"pos += {width} + n if n > 0 else {width}"]


def _tag_scanner(entity_type: type[Any]) -> Callable[[Any, int, int, int], int]:
    flexible = bool(entity_type.__flexible__)
    tagged: dict[int, _Scan] = {}
    for fld in fields(entity_type):
        tag = get_field_tag(fld)
        if tag is not None:
            tagged[int(tag)] = _field_scanner(fld, flexible, True)[0]

    def scan_tags(buf: Any, pos: int, end: int, count: int) -> int:
        if count > end - pos:
            raise DecodeError(f"{count} tagged fields declared in {end - pos} bytes")
        for _ in range(count):
            tag, pos = read_uvarint(buf, pos, end)
            size, pos = read_uvarint(buf, pos, end)
            tag_end = pos + size
            if tag_end > end:
                raise DecodeError("tagged field runs past the end of the body")
            inner = tagged.get(tag)
            # A known tag's value must fill its declared size: a peer reads the value by its
            # schema, not by the size, and would take what a longer size hides for the fields
            # after it (a broker could smuggle node endpoints past this walk that way).
            if inner is not None and inner(buf, pos, tag_end) != tag_end:
                raise DecodeError(f"tagged field {tag} declares {size} bytes, its value "
                                  f"holds {inner(buf, pos, tag_end) - pos}")
            pos = tag_end
        return pos

    return scan_tags


def _field_scanner(fld: Any, flexible: bool, is_tag: bool) -> tuple[_Scan, int]:
    field_class = classify_field(fld)
    if isinstance(field_class, PrimitiveField):
        return _primitive_scanner(get_schema_field_type(fld), flexible)
    if isinstance(field_class, EntityField):
        inner, size = _entity_scanner(field_class.type_)
        if is_tag or not is_optional(fld):
            return inner, size
        return _nullable_scanner(inner), 1
    if isinstance(field_class, PrimitiveTupleField):
        item, item_size = _primitive_scanner(get_schema_field_type(fld), flexible)
        return _array_scanner(item, item_size, flexible, get_schema_field_type(fld))
    if isinstance(field_class, EntityTupleField):
        item, item_size = _entity_scanner(field_class.type_)
        return _array_scanner(item, item_size, flexible, None)
    raise DecodeError(f"unsupported field {fld.name}")  # pragma: no cover


def _skip(size: int) -> _Scan:
    def scan_fixed(buf: Any, pos: int, end: int) -> int:
        return pos + size

    scan_fixed.fixed_size = size  # type: ignore[attr-defined]
    return scan_fixed


def _primitive_scanner(kafka_type: str, flexible: bool) -> tuple[_Scan, int]:
    fixed = _FIXED.get(kafka_type)
    if fixed is not None:
        return _skip(fixed), fixed
    if kafka_type not in ("string", "bytes", "records"):
        raise DecodeError(f"unknown kafka type {kafka_type}")  # pragma: no cover
    if flexible:

        def scan_compact(buf: Any, pos: int, end: int) -> int:
            n, pos = read_uvarint(buf, pos, end)
            return pos + n - 1 if n else pos

        return scan_compact, 1
    if kafka_type == "string":

        def scan_string(buf: Any, pos: int, end: int) -> int:
            return pos + 2 + max(_i16(buf, pos)[0], 0)

        return scan_string, 2

    def scan_bytes(buf: Any, pos: int, end: int) -> int:
        return pos + 4 + max(_i32(buf, pos)[0], 0)

    return scan_bytes, 4


def _nullable_scanner(inner: _Scan) -> _Scan:
    def scan(buf: Any, pos: int, end: int) -> int:
        if pos >= end:
            raise DecodeError("body truncated")
        if buf[pos] == 0xFF:
            return pos + 1
        return inner(buf, pos + 1, end)

    return scan


def _array_scanner(
    item: _Scan, item_size: int, flexible: bool, primitive: str | None
) -> tuple[_Scan, int]:
    fixed = _FIXED.get(primitive) if primitive is not None else None

    def scan(buf: Any, pos: int, end: int) -> int:
        if flexible:
            n, pos = read_uvarint(buf, pos, end)
            n -= 1
        else:
            n = _i32(buf, pos)[0]
            pos += 4
        if n <= 0:
            return pos
        if n * item_size > end - pos:
            raise DecodeError(f"array of {n} items declared in {end - pos} bytes")
        if fixed is not None:
            return pos + n * fixed
        for _ in range(n):
            pos = item(buf, pos, end)
        return pos

    return scan, 1 if flexible else 4
