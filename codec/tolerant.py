"""A slower, spec-following decoder used when kio's native reader refuses a message because
it carries tagged fields that kio's schema does not define.

Kafka's rule (KIP-482) is that a reader skips tags it does not know. kio's compiled reader
raises instead, so on that failure `messages` retries here: this walks the same kio dataclass
schema field by field, reads every primitive with kio's own compiled field readers, recurses
into nested structures itself, and skips unknown tags. Unknown tag values are dropped: a
message decoded this way re-encodes without them.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, fields
from typing import Any

from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)
from kio.serial._parse import get_field_reader
from kio.serial.readers import (
    read_compact_array_length,
    read_int8,
    read_legacy_array_length,
    read_unsigned_varint,
)

from .errors import DecodeError

__all__ = ["read_entity_tolerant"]

_Reader = Any  # (buffer, offset) -> (value, new_offset_delta)


def read_entity_tolerant(entity_type: type[Any], buf: Any, offset: int) -> tuple[Any, int]:
    """Decode `entity_type` at `offset`; return (entity, bytes consumed)."""
    return _entity_reader(entity_type)(buf, offset)


_readers: dict[object, _Reader] = {}


def _entity_reader(entity_type: type[Any]) -> _Reader:
    reader = _readers.get(entity_type)
    if reader is None:
        reader = _readers[entity_type] = _build_entity_reader(entity_type)
    return reader


def _build_entity_reader(entity_type: type[Any]) -> _Reader:
    flexible = bool(entity_type.__flexible__)
    plain: list[tuple[str, _Reader]] = []
    tagged: dict[int, tuple[str, _Reader]] = {}
    defaults: dict[str, Any] = {}
    for fld in fields(entity_type):
        tag = get_field_tag(fld)
        reader = _field_reader(entity_type, fld, tag is not None)
        if tag is None:
            plain.append((fld.name, reader))
        else:
            tagged[int(tag)] = (fld.name, reader)
            defaults[fld.name] = (
                fld.default if fld.default is not MISSING else get_tagged_field_default(fld)
            )

    def read(buf: Any, offset: int) -> tuple[Any, int]:
        pos = offset
        values: dict[str, Any] = {}
        for name, reader in plain:
            value, size = reader(buf, pos)
            values[name] = value
            pos += size
        if flexible:
            values.update(defaults)
            count, size = read_unsigned_varint(buf, pos)
            pos += size
            for _ in range(count):
                tag, size = read_unsigned_varint(buf, pos)
                pos += size
                length, size = read_unsigned_varint(buf, pos)
                pos += size
                end = pos + length
                if end > len(buf):
                    raise DecodeError("tagged field runs past the end of the buffer")
                known = tagged.get(tag)
                if known is not None:
                    name, reader = known
                    value, size = reader(buf, pos)
                    if pos + size != end:
                        raise DecodeError(f"tagged field {tag} has inconsistent length")
                    values[name] = value
                pos = end
        return entity_type(**values), pos - offset

    return read


def _field_reader(entity_type: type[Any], fld: Field[Any], is_tag: bool) -> _Reader:
    field_class = classify_field(fld)
    flexible = bool(entity_type.__flexible__)
    if isinstance(field_class, PrimitiveField | PrimitiveTupleField):
        return get_field_reader(entity_type, fld, False, is_tag)
    if isinstance(field_class, EntityField):
        inner = _entity_reader(field_class.type_)
        if is_tag or not is_optional(fld):
            return inner
        return _nullable(inner)
    if isinstance(field_class, EntityTupleField):
        return _array(_entity_reader(field_class.type_), flexible)
    raise DecodeError(f"unsupported field {fld.name}")  # pragma: no cover


def _nullable(inner: _Reader) -> _Reader:
    def read(buf: Any, offset: int) -> tuple[Any, int]:
        marker, size = read_int8(buf, offset)
        if marker == -1:
            return None, size
        value, inner_size = inner(buf, offset + size)
        return value, size + inner_size

    return read


def _array(inner: _Reader, flexible: bool) -> _Reader:
    read_length = read_compact_array_length if flexible else read_legacy_array_length

    def read(buf: Any, offset: int) -> tuple[Any, int]:
        length, size = read_length(buf, offset)
        if length is None or length < 0:
            return None, size
        pos = offset + size
        if length > len(buf) - pos:
            raise DecodeError(f"array length {length} exceeds the remaining bytes")
        items = []
        for _ in range(length):
            value, item_size = inner(buf, pos)
            items.append(value)
            pos += item_size
        return tuple(items), pos - offset

    return read
