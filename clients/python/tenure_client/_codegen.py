"""Render ``models.py`` from the service's OpenAPI schema.

    python -m tenure_client._codegen openapi.json > tenure_client/models.py

The service's test suite renders the live schema of ``create_app()`` and compares it with the
checked-in ``models.py`` (as syntax trees, so formatting does not matter): a change to an API model
that is not regenerated here fails CI. Pure functions, no import of the service.
"""

from __future__ import annotations

import json
import keyword
import sys
from typing import Any

HEADER = '''"""Typed request and response models of the Tenure API.

Generated from the service's OpenAPI schema by ``tenure_client._codegen``: do not edit by hand.
Response models accept fields they do not know (a newer server may add some); request models
reject unknown ones, as the server does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict{field}
'''


def class_name(schema_name: str) -> str:
    """``service__api__routes__beliefs__ResolveIn`` -> ``BeliefsResolveIn`` (FastAPI qualifies
    names that two modules share)."""
    if "__" not in schema_name:
        return schema_name
    parts = schema_name.split("__")
    return parts[-2].title().replace("_", "") + parts[-1]


def _ref(ref: str) -> str:
    return class_name(ref.rsplit("/", 1)[-1])


def annotation(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return _ref(schema["$ref"])
    if "anyOf" in schema or "oneOf" in schema:
        options = [annotation(s) for s in schema.get("anyOf", schema.get("oneOf", []))]
        unique = list(dict.fromkeys(options))
        if "None" in unique:  # keep "X | None" readable
            unique = [o for o in unique if o != "None"] + ["None"]
        return " | ".join(unique)
    if "const" in schema:
        return f"Literal[{schema['const']!r}]"
    if "enum" in schema:
        return "Literal[" + ", ".join(repr(v) for v in schema["enum"]) + "]"
    kind = schema.get("type")
    if kind == "string":
        return "datetime" if schema.get("format") == "date-time" else "str"
    if kind == "integer":
        return "int"
    if kind == "number":
        return "float"
    if kind == "boolean":
        return "bool"
    if kind == "null":
        return "None"
    if kind == "array":
        return f"list[{annotation(schema.get('items', {}))}]"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"dict[str, {annotation(schema['additionalProperties'])}]"
    if kind == "object":
        return "dict[str, Any]"
    return "Any"


def _default(prop: dict[str, Any], required: bool) -> str | None:
    """The right-hand side of a field: nothing when required, else the schema's default."""
    if required:
        return None
    if "default" not in prop:
        return "None"
    value = prop["default"]
    if isinstance(value, list | dict):
        factory = "list" if isinstance(value, list) else "dict"
        return f"Field(default_factory={factory})" if not value else f"Field(default_factory=lambda: {value!r})"
    return repr(value)


def _field(name: str, prop: dict[str, Any], required: bool) -> str:
    hint = annotation(prop)
    default = _default(prop, required)
    if default == "None" and "None" not in hint.split(" | "):
        hint += " | None"
    python_name = name
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        python_name = name.strip("_") + "_"
        alias = f"alias={name!r}"
        default = f"Field({alias})" if default is None else f"Field({default}, {alias})"
    line = f"    {python_name}: {hint}"
    return line if default is None else f"{line} = {default}"


def _model(name: str, schema: dict[str, Any], requests: set[str]) -> str:
    lines = [f"class {class_name(name)}(BaseModel):"]
    description = (schema.get("description") or "").strip().replace('"""', "'''")
    if description:
        lines.append(f'    """{description}"""')
        lines.append("")
    extra = "forbid" if name in requests else "allow"
    lines.append(f'    model_config = ConfigDict(extra="{extra}", populate_by_name=True)')
    lines.append("")
    required = set(schema.get("required", []))
    properties = schema.get("properties", {})
    lines += [_field(prop_name, prop, prop_name in required) for prop_name, prop in properties.items()]
    return "\n".join(lines)


def _alias(name: str, schema: dict[str, Any]) -> str:
    return f"{class_name(name)} = {annotation(schema)}"


def _refs(schema: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str):
                found.add(value.rsplit("/", 1)[-1])
            else:
                found |= _refs(value)
    elif isinstance(schema, list):
        for item in schema:
            found |= _refs(item)
    return found


def _ordered(schemas: dict[str, Any]) -> list[str]:
    """Dependencies first (type aliases must exist before use), alphabetical otherwise."""
    done: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for dep in sorted(_refs(schemas[name])):
            if dep in schemas:
                visit(dep)
        done.append(name)

    for name in sorted(schemas):
        visit(name)
    return done


def request_schemas(openapi: dict[str, Any]) -> set[str]:
    """Schemas that some operation takes as its JSON body (serialised strictly)."""
    names: set[str] = set()
    for operations in openapi.get("paths", {}).values():
        for operation in operations.values():
            content = (operation.get("requestBody") or {}).get("content", {})
            names |= _refs(content.get("application/json", {}).get("schema", {}))
    return names


def render(openapi: dict[str, Any]) -> str:
    schemas: dict[str, Any] = openapi.get("components", {}).get("schemas", {})
    requests = request_schemas(openapi)
    blocks: list[str] = []
    for name in _ordered(schemas):
        schema = schemas[name]
        is_model = schema.get("type") == "object" and "properties" in schema
        blocks.append(_model(name, schema, requests) if is_model else _alias(name, schema))
    exported = ", ".join(repr(class_name(n)) for n in sorted(schemas, key=class_name))
    body = "\n\n\n".join(blocks)
    header = HEADER.replace("{field}", ", Field" if "Field(" in body else "")
    return header + "\n\n" + body + f"\n\n\n__all__ = [{exported}]\n"


if __name__ == "__main__":  # pragma: no cover - a developer's command
    source = sys.argv[1] if len(sys.argv) > 1 else "-"
    text = sys.stdin.read() if source == "-" else open(source).read()  # noqa: SIM115
    sys.stdout.write(render(json.loads(text)))
