"""kio Produce entities for the scan/splice tests, built from the codec's kio schemas."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from kio.serial._introspect import classify_field


def element(cls: type[Any], field_name: str) -> type[Any]:
    """The element class of a tuple-of-entities field (or the class of an entity field)."""
    (fld,) = (f for f in fields(cls) if f.name == field_name)
    found: type[Any] = classify_field(fld).type_
    return found
