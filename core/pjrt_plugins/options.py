"""Client create options: the schema types and the check made before the C call.

Some PJRT plugins abort the process on a mistyped option and ignore unknown ones,
so every option is validated here, in Python, before it reaches
``PJRT_Client_Create``. Pure Python: no cffi, no library.
"""

from __future__ import annotations

import difflib
import enum
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class OptionType(enum.IntEnum):
    """The value kinds of ``PJRT_NamedValue`` (the integers are the C enum's)."""

    STRING = 0
    INT64 = 1
    INT64_LIST = 2
    FLOAT = 3
    BOOL = 4

    @classmethod
    def coerce(cls, spec: Any) -> OptionType:
        """Turn a schema entry (``str``, ``int``, ``list[int]``, ...) into an OptionType."""
        if isinstance(spec, OptionType):
            return spec
        if spec is str:
            return cls.STRING
        if spec is bool:
            return cls.BOOL
        if spec is int:
            return cls.INT64
        if spec is float:
            return cls.FLOAT
        if spec == list[int] or spec == tuple[int, ...] or spec is list:
            return cls.INT64_LIST
        if isinstance(spec, str):
            try:
                return cls[spec.upper()]
            except KeyError:
                pass
        raise TypeError(
            f"unsupported option type {spec!r} in a client option schema; "
            "use str, int, float, bool or list[int]"
        )


@dataclass(frozen=True)
class NamedValue:
    """One validated option, ready to be encoded as a ``PJRT_NamedValue``."""

    name: str
    type: OptionType
    value: str | int | float | bool | tuple[int, ...]


def normalize_schema(schema: Mapping[str, Any] | None) -> dict[str, OptionType] | None:
    """Return ``{name: OptionType}``; raises ``TypeError`` for a malformed schema."""
    if schema is None:
        return None
    if not isinstance(schema, Mapping):
        raise TypeError(f"a client option schema must be a mapping of name to type, got {type(schema).__name__}")
    out: dict[str, OptionType] = {}
    for name, spec in schema.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"client option names must be non-empty strings, got {name!r}")
        out[name] = OptionType.coerce(spec)
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _infer_type(name: str, value: Any) -> OptionType:
    if isinstance(value, bool):
        return OptionType.BOOL
    if _is_int(value):
        return OptionType.INT64
    if isinstance(value, numbers.Real):
        return OptionType.FLOAT
    if isinstance(value, str):
        return OptionType.STRING
    if isinstance(value, Sequence) and all(_is_int(v) for v in value):
        return OptionType.INT64_LIST
    raise TypeError(
        f"client option {name!r} has a value of type {type(value).__name__}; "
        "options must be str, int, float, bool or a list of ints"
    )


def _convert(name: str, value: Any, kind: OptionType) -> str | int | float | bool | tuple[int, ...]:
    def wrong() -> TypeError:
        return TypeError(
            f"client option {name!r} must be {kind.name.lower()}, got {type(value).__name__} {value!r}"
        )

    if kind is OptionType.BOOL:
        if not isinstance(value, bool):
            raise wrong()
        return value
    if kind is OptionType.INT64:
        if not _is_int(value):
            raise wrong()
        if not -(2**63) <= int(value) < 2**63:
            raise ValueError(f"client option {name!r} = {value} does not fit in int64")
        return int(value)
    if kind is OptionType.FLOAT:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise wrong()
        return float(value)
    if kind is OptionType.STRING:
        if not isinstance(value, str):
            raise wrong()
        return value
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(_is_int(v) for v in value):
        raise wrong()
    return tuple(int(v) for v in value)


def validate_options(
    values: Mapping[str, Any], schema: Mapping[str, Any] | None, *, plugin: str = "the plugin"
) -> list[NamedValue]:
    """Check ``values`` against ``schema`` and return them typed.

    Raises ``ValueError`` for an unknown name (listing the known ones) and
    ``TypeError`` for a value of the wrong type. With no schema, the types are
    inferred from the values and any name is accepted.
    """
    known = normalize_schema(schema)
    result: list[NamedValue] = []
    for name, value in values.items():
        if not isinstance(name, str):
            raise TypeError(f"client option names must be strings, got {name!r}")
        if known is None:
            kind = _infer_type(name, value)
        elif name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            listing = ", ".join(sorted(known)) or "(none)"
            raise ValueError(f"unknown client option {name!r} for {plugin}.{hint} Known options: {listing}")
        else:
            kind = known[name]
        result.append(NamedValue(name, kind, _convert(name, value, kind)))
    return result
