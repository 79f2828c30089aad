"""Avro schemas: names resolved by the Avro specification's rules, and writer schemas seen as Connect schemas,
so that one mapping (:func:`cdcsync.sources.debezium.connect.connect_pg_type`) types the columns of both formats.

Kafka Connect's ``AvroConverter`` keeps a Connect schema's identity in annotations: ``connect.name`` (the logical
type), ``connect.parameters`` (its parameters, e.g. a Decimal's scale and precision) and ``connect.type`` (``int8``
and ``int16``, which Avro writes as ``int``). Schemas written without them (by other producers) carry Avro's own
``logicalType`` instead, which is read as the Connect type with the same meaning, as the decoder does
(:func:`annotations`: ``connect.name`` first, then ``logicalType``). Used by ``cdcsync init`` on the registry's
latest schema and by the decoder on each writer schema (schema changes), so both see the same types.
"""

from __future__ import annotations

from typing import Any

from cdcsync.sources.debezium.values import DEBEZIUM_DECIMAL

_NAMED = ("record", "error", "enum", "fixed")
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


def full_name(schema: dict[str, Any], namespace: str) -> tuple[str, str]:
    """(full name, namespace its nested types inherit), by the Avro specification's rules."""
    name = str(schema.get("name", ""))
    if "." in name:
        return name, name.rsplit(".", 1)[0]
    space = schema.get("namespace", namespace) or ""
    return (f"{space}.{name}" if space else name), space


def collect_names(schema: Any, namespace: str, names: dict[str, Any]) -> None:
    if isinstance(schema, list):
        for branch in schema:
            collect_names(branch, namespace, names)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in _NAMED:
            full, space = full_name(schema, namespace)
            names[full] = (schema, space)
            names.setdefault(full.rsplit(".", 1)[-1], (schema, space))
            for f in schema.get("fields", []) if kind in ("record", "error") else []:
                if isinstance(f, dict):
                    collect_names(f.get("type"), space, names)
        elif kind == "array":
            collect_names(schema.get("items"), namespace, names)
        elif kind == "map":
            collect_names(schema.get("values"), namespace, names)
        elif isinstance(kind, (dict, list)):
            collect_names(kind, namespace, names)


def resolve(schema: Any, names: dict[str, Any], namespace: str) -> tuple[Any, str]:
    """A type reference by name resolved to its definition; (schema, namespace for what is inside it)."""
    if isinstance(schema, str) and schema not in _PRIMITIVES:
        for candidate in (f"{namespace}.{schema}" if namespace and "." not in schema else schema, schema):
            if candidate in names:
                return names[candidate]
        return schema, namespace
    if isinstance(schema, dict):
        kind = schema.get("type")
        if isinstance(kind, (dict, list)):  # {"type": {...}} wrapping
            return resolve(kind, names, namespace)
        if kind in _NAMED:
            return schema, full_name(schema, namespace)[1]
    return schema, namespace


def record_fields(schema: Any, names: dict[str, Any], namespace: str) -> tuple[dict[str, Any], str] | None:
    """{field name: type} of a record (or of the one record in an optional union), else None."""
    schema, namespace = resolve(schema, names, namespace)
    if isinstance(schema, list):
        live = [resolve(b, names, namespace) for b in schema if b != "null"]
        if len(live) != 1:
            return None
        schema, namespace = live[0]
    if not isinstance(schema, dict) or schema.get("type") not in ("record", "error"):
        return None
    fields = {f["name"]: f.get("type") for f in schema.get("fields", []) if isinstance(f, dict) and "name" in f}
    return fields, namespace


def avro_annotations(schema: Any) -> tuple[str, str | None, dict[str, Any]]:
    """(Avro base type, logical name: ``connect.name`` else ``logicalType``, the schema dict or {})."""
    if isinstance(schema, dict):
        base = schema.get("type")
        name = schema.get("connect.name") or schema.get("logicalType")
        return (base if isinstance(base, str) else ""), (name if isinstance(name, str) else None), schema
    return (schema if isinstance(schema, str) else ""), None, {}


_LOGICAL_AS_CONNECT: dict[str, str] = {
    "decimal": DEBEZIUM_DECIMAL,
    "date": "org.apache.kafka.connect.data.Date",
    "time-millis": "org.apache.kafka.connect.data.Time",
    "time-micros": "io.debezium.time.MicroTime",
    "timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
    "local-timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
    "timestamp-micros": "io.debezium.time.MicroTimestamp",
    "local-timestamp-micros": "io.debezium.time.MicroTimestamp",
    "timestamp-nanos": "io.debezium.time.NanoTimestamp",
    "local-timestamp-nanos": "io.debezium.time.NanoTimestamp",
    "uuid": "io.debezium.data.Uuid",
}
_AVRO_BASE_AS_CONNECT = {
    "long": "int64",
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "string": "string",
    "enum": "string",
    "bytes": "bytes",
    "fixed": "bytes",
}


def connect_schema(schema: Any, names: dict[str, Any], namespace: str = "") -> dict[str, Any]:
    """The Connect schema an Avro (field) schema stands for; ``{"type": "union"}`` for a union of several
    non-null types, which no column type reads."""
    schema, namespace = resolve(schema, names, namespace)
    if isinstance(schema, list):
        live = [branch for branch in schema if branch != "null"]
        if len(live) != 1:
            return {"type": "union"}
        return connect_schema(live[0], names, namespace)
    base, logical, info = avro_annotations(schema)
    out: dict[str, Any]
    if base == "int":
        out = {"type": info.get("connect.type") if info.get("connect.type") in ("int8", "int16") else "int32"}
    elif base == "array":
        out = {"type": "array", "items": connect_schema(info.get("items"), names, namespace)}
    elif base == "map":
        out = {"type": "map"}
    elif base in ("record", "error"):
        out = {"type": "struct", "fields": row_fields_of_record(schema, names, namespace) or []}
    else:
        out = {"type": _AVRO_BASE_AS_CONNECT.get(base, base)}
    name = info.get("connect.name")
    if not isinstance(name, str):
        name = _LOGICAL_AS_CONNECT.get(logical or "")
    if name:
        out["name"] = name
    parameters = info.get("connect.parameters")
    params = {str(k): str(v) for k, v in parameters.items()} if isinstance(parameters, dict) else {}
    if name == DEBEZIUM_DECIMAL and "scale" not in params:  # Avro's own decimal annotation
        params["scale"] = str(info.get("scale", 0))
        if isinstance(info.get("precision"), int):
            params["connect.decimal.precision"] = str(info["precision"])
    if params:
        out["parameters"] = params
    return out


def row_fields_of_record(schema: Any, names: dict[str, Any], namespace: str = "") -> list[dict[str, Any]] | None:
    """Connect field schemas (with ``field``) of an Avro record, or None when ``schema`` is not a record."""
    record = record_fields(schema, names, namespace)
    if record is None:
        return None
    fields, inner = record
    return [dict(connect_schema(avro_type, names, inner), field=name) for name, avro_type in fields.items()]


def envelope_row_fields(schema: Any, names: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Connect field schemas of a Debezium envelope's row record (``after``, else ``before``), or None."""
    top = record_fields(schema, names, "")
    if top is None:
        return None
    envelope, namespace = top
    for struct in ("after", "before"):
        if struct in envelope:
            fields = row_fields_of_record(envelope[struct], names, namespace)
            if fields is not None:
                return fields
    return None
