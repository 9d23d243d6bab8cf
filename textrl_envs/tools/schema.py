"""Tools as Python functions, described by JSON schema, and the check of a call's arguments against it.

A tool is a plain function with type hints and a Google-style docstring (an ``Args:`` section), the form transformers'
``get_json_schema`` reads, which is also what the chat template's ``tools=`` argument takes::

    def multiply(a: int, b: int) -> int:
        '''Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        '''
        return a * b

:func:`tool_schemas` checks a list of tools and gives each one's schema; :func:`argument_errors` says what is wrong
with the arguments a model wrote for one (missing, unknown, or of the wrong JSON type), so that a wrong call is an
answer the model can learn from, never a crash.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["argument_errors", "tool_schemas"]

#: The Python values each JSON schema type accepts (``bool`` is not a number here, as in JSON).
_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
    "any": lambda v: True,  # noqa: ARG005  (a parameter typed Any)
}


def tool_schemas(tools: Sequence[Callable]) -> dict[str, tuple[Callable, dict[str, Any]]]:
    """Each tool by name, with its JSON schema (transformers' ``get_json_schema``: ``{"type": "function",
    "function": {"name", "description", "parameters"}}``).

    :param tools: A non-empty list of functions with type hints and an ``Args:`` docstring.
    :raises TypeError: for something that is not a function, or a list that is empty.
    :raises ValueError: for a function whose schema cannot be read (naming it and what to add), or two tools of one
        name.
    """
    from transformers.utils import get_json_schema

    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence) or not tools:
        raise TypeError(f"tools must be a non-empty list of Python functions, got {tools!r}")
    out: dict[str, tuple[Callable, dict[str, Any]]] = {}
    for tool in tools:
        if not callable(tool):
            raise TypeError(f"tools must be Python functions; got {tool!r} ({type(tool).__name__})")
        try:
            schema = get_json_schema(tool)
        except Exception as err:  # noqa: BLE001  (transformers raises several kinds: name the tool and the fix)
            name = getattr(tool, "__name__", repr(tool))
            raise ValueError(
                f"tool {name!r} cannot be described to the model ({type(err).__name__}: {err}); give it type hints "
                "for every argument and a Google-style docstring with a one-line description and an 'Args:' section "
                "that describes each argument (transformers' get_json_schema reads them)"
            ) from err
        name = schema["function"]["name"]
        if name in out:
            raise ValueError(f"two tools are named {name!r}; tool names must be unique")
        out[name] = (tool, schema)
    return out


def _type_names(spec: Mapping[str, Any]) -> list[str]:
    kind = spec.get("type", "any")
    return list(kind) if isinstance(kind, list) else [kind]


def _value_error(name: str, value: Any, spec: Mapping[str, Any]) -> str | None:
    kinds = _type_names(spec)
    if not any(_JSON_TYPES.get(k, _JSON_TYPES["any"])(value) for k in kinds):
        return f"argument {name!r} must be {' or '.join(kinds)}, got {value!r}"
    if "enum" in spec and value not in spec["enum"]:
        return f"argument {name!r} must be one of {spec['enum']}, got {value!r}"
    items = spec.get("items")
    if isinstance(value, list) and isinstance(items, Mapping):
        for i, item in enumerate(value):
            error = _value_error(f"{name}[{i}]", item, items)
            if error:
                return error
    return None


def argument_errors(schema: Mapping[str, Any], arguments: Any) -> list[str]:
    """What is wrong with ``arguments`` for the tool of ``schema`` (empty: nothing).

    :param schema: The tool's schema (:func:`tool_schemas`).
    :param arguments: What the model wrote: a dict of argument values, as JSON decodes them.
    """
    if not isinstance(arguments, dict):
        return [f"arguments must be a JSON object of name: value, got {arguments!r}"]
    params = schema["function"].get("parameters", {})
    properties = params.get("properties", {})
    errors = [f"missing argument {r!r}" for r in params.get("required", []) if r not in arguments]
    known = ", ".join(properties) or "none"
    errors += [f"unknown argument {k!r} (known: {known})" for k in arguments if k not in properties]
    for key, value in arguments.items():
        if key in properties:
            error = _value_error(key, value, properties[key])
            if error:
                errors.append(error)
    return errors
