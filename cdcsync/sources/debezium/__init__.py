"""Decode Debezium change events: Kafka-shaped Arrow batches in, typed change rows and dead letters out.

The modules, in the order a message meets them:

* :mod:`.dispatch`: the entry points (:func:`~.dispatch.decode_batches`, the ``mapInArrow`` body; the Spark
  schema of its output) and the plan of a spec by format;
* :mod:`.spec`: :class:`~.spec.DecodeSpec` (what to decode) and the output's Arrow schema;
* :mod:`.json` (JsonConverter, with and without schemas) and :mod:`.avro` (Confluent wire format, with
  :mod:`.avro_registry` for writer schemas, :mod:`.avro_schema` for their names and Connect types, and
  :mod:`.avro_values` turning Avro values into what JsonConverter would have written): each reads its messages
  into Debezium payloads for the shared :mod:`.plan`, which runs a generated row decoder and builds the batches;
* :mod:`.columnar`: the batch path of :mod:`.json`, which decodes a batch of common Debezium messages at once
  with Arrow's JSON reader and ``pyarrow.compute``, and leaves anything it cannot read exactly to the row decoder
  (a batch path only ever declines: the row decoder is the reference, see :mod:`.columnar`'s docstring);
  :mod:`.avro_columnar`, the batch path of :mod:`.avro` (tombstones' keys too), walks a writer schema over a
  whole batch with numpy and shares those conversions; :mod:`.wrappers`: JsonConverter's schema wrapper, which
  the JVM cuts off before the messages cross into Python, and how the decoder restores it where it must;
* :mod:`.envelope`: ``op``, the ``source`` block, the ``_cdc_*`` / ``_dlq_*`` columns, TOAST placeholders;
* :mod:`.converters` (by declared type, and arrays), :mod:`.numbers`, :mod:`.temporal`, :mod:`.text`: one value
  into its column's type, sharing :mod:`.values`;
* :mod:`.connect`: Connect schemas as column types (``cdcsync init``) and schema changes (``cdcsync run``).

Values are checked against the declared type and never rounded silently: an integer out of the column's range,
a decimal with more digits than ``numeric(p,s)`` allows, a ``varchar(n)`` that is too long, a text with a NUL
character (Postgres cannot store it) all become dead letters naming the column, the value and the type.
"""
