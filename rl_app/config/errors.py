"""Turn pydantic validation errors into one readable line: the key and what is allowed."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

# Names pydantic puts into error locations for union members; they are not keys.
_UNION_TAGS = {"int", "float", "str", "bool", "list", "tuple", "dict", "none", "function-after"}


def _field_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _nested_model(arg)
            if found is not None:
                return found
    return None


def _mapping_values(annotation: Any) -> type[BaseModel] | None:
    """The model of the values of a ``dict[str, Model]`` field (``sweep.space``)."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(candidate) is dict:
            return _nested_model(typing.get_args(candidate)[1])
    return None


def _walk(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[list[str], type[BaseModel] | None]:
    """Follow ``loc`` through the schema; return the real key path and the innermost model."""
    keys: list[str] = []
    current: type[BaseModel] | None = model
    mapping_values: type[BaseModel] | None = None
    for part in loc:
        if mapping_values is not None:  # a free-form key of a mapping, such as 'training.lr'
            keys.append(str(part))
            current, mapping_values = mapping_values, None
            continue
        if isinstance(part, int):
            keys[-1:] = [f"{keys[-1]}[{part}]"] if keys else [f"[{part}]"]
            current = None
            continue
        if current is not None:
            by_alias = {info.alias or name: info for name, info in current.model_fields.items()}
            if part in by_alias:
                keys.append(part)
                annotation = by_alias[part].annotation
                current = _nested_model(annotation)
                mapping_values = _mapping_values(annotation)
                continue
        if part in _UNION_TAGS or not str(part).isidentifier():
            continue
        keys.append(str(part))
        current = None
    return keys, current


def _describe(error: Any) -> str | None:
    kind, ctx = error["type"], error.get("ctx", {})
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<"}
    if kind in bounds:
        return f"a number {bounds[kind]} {next(iter(ctx.values())):g}"
    if kind == "less_than_equal":
        return f"a number <= {ctx['le']:g}"
    if kind == "literal_error":
        return f"one of {ctx['expected']}"
    simple = {
        "int_type": "an integer",
        "int_parsing": "an integer",
        "int_from_float": "an integer",
        "float_type": "a number",
        "float_parsing": "a number",
        "bool_type": "true or false",
        "bool_parsing": "true or false",
        "string_type": "a string",
        "list_type": "a list",
        "tuple_type": "a list",
        "dict_type": "a mapping",
        "model_type": "a mapping",
        "model_attributes_type": "a mapping",
    }
    if kind in simple:
        return simple[kind]
    if kind == "none_required":
        return None
    return None


def describe_validation_error(exc: ValidationError, model: type[BaseModel]) -> tuple[str, str]:
    """The dotted key of the first problem and a message saying what is wrong and allowed."""
    errors = exc.errors()
    first_keys, _ = _walk(model, errors[0]["loc"])
    key = ".".join(first_keys) or "(top level)"
    same_key = [e for e in errors if _walk(model, e["loc"])[0] == first_keys]
    first = same_key[0]

    if first["type"] == "extra_forbidden":
        unknown = first_keys[-1]
        _, parent = _walk(model, first["loc"][:-1])
        allowed = _field_names(parent) if parent is not None else []
        close = difflib.get_close_matches(unknown, allowed, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return key, f"unknown key{hint} (allowed: {', '.join(allowed)})"
    if first["type"] == "missing":
        return key, "required key is missing"
    value_errors = [e for e in same_key if e["type"] in ("value_error", "assertion_error")]
    if value_errors:
        message = str(value_errors[0]["msg"]).removeprefix("Value error, ")
        return key, message

    wanted = [d for d in (_describe(e) for e in same_key) if d is not None]
    if not wanted:
        wanted = [str(first["msg"]).lower()]
    unique = list(dict.fromkeys(wanted))
    got = first.get("input")
    return key, f"must be {' or '.join(unique)} (got {got!r})"
