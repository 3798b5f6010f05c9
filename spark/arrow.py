"""Rows from PostgreSQL to Arrow record batches of a read's Spark schema, for the native source's tasks.

The ADBC PostgreSQL driver runs a query as ``COPY (query) TO STDOUT (FORMAT BINARY)`` and builds Arrow
arrays in C++: no Python object per row. It replaced a text COPY parsed by Arrow's CSV reader, and costs less
CPU per row on both sides: no text to parse in the client, no text formatting of timestamps, arrays and bytes
on the server (``python -m bench spark-source``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.errors import ConfigurationError, DatabaseUnavailable
from pgjournal.server.dsn import mask_dsn, redact

from .decode import REDACTED, PayloadDecoder

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
#: What decoding needs beside the payload's columns: an encrypted payload's key (and its AES-GCM associated
#: data) is its persistence id's.
KEY_COLUMN = "persistence_id"


@dataclass(frozen=True)
class Columns:
    """What a read returns (``output``, the Spark schema's names in order), which of them is the decoded
    payload (``decoded``) and the redaction flag (``redacted``), and what it selects from the table (``read``:
    the outputs but those two, then whatever decoding needs that the outputs lack: the payload's columns and
    the persistence id, which opens an encrypted payload)."""

    output: tuple[str, ...]
    decoded: str | None
    read: tuple[str, ...]
    #: ``(ser_id, manifest, payload)``: the columns decoding reads.
    serialized: tuple[str, str, str]
    redacted: str | None = None

    @classmethod
    def of(cls, output: Sequence[str], decoded_name: str, serialized: tuple[str, str, str]) -> Columns:
        decoded = decoded_name if decoded_name in output else None
        redacted = REDACTED if REDACTED in output else None
        read = [c for c in output if c not in (decoded_name, REDACTED)]
        if decoded is not None or redacted is not None:
            read += [c for c in (*serialized, KEY_COLUMN) if c not in read]
        return cls(tuple(output), decoded, tuple(read), serialized, redacted)

    @property
    def decodes(self) -> bool:
        return self.decoded is not None or self.redacted is not None


class ArrowRows:
    """Record batches as the driver reads them (:attr:`Columns.read` order) -> record batches of the read's
    Spark schema, payloads decoded by a :class:`~spark.decode.PayloadDecoder` over ``serializers`` (the
    journal's registry as the database must be read; default: a plain one).

    Picklable: built where Spark plans the read, used in every task. :attr:`decoded_rows` counts the payloads
    decoded by this instance, :attr:`fast_rows` those of them decoded by Arrow's JSON reader.
    """

    def __init__(self, schema: StructType, columns: Columns, serializers: SerializerRegistry | None = None) -> None:
        if list(schema.fieldNames()) != list(columns.output):
            raise ConfigurationError(f"schema {schema.simpleString()} does not match columns {columns.output}")
        self.columns = columns
        self.schema_json = schema.json()
        self.decoder = PayloadDecoder(serializers if serializers is not None else SerializerRegistry())
        self._arrow: pa.Schema | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrow": None}

    @property
    def decoded_rows(self) -> int:
        return self.decoder.decoded_rows

    @property
    def fast_rows(self) -> int:
        return self.decoder.fast_rows

    @property
    def arrow_schema(self) -> pa.Schema:
        if self._arrow is None:
            from pyspark.sql.pandas.types import to_arrow_schema
            from pyspark.sql.types import StructType

            self._arrow = to_arrow_schema(StructType.fromJson(json.loads(self.schema_json)), timezone="UTC")
        return self._arrow

    def convert(self, raw: pa.RecordBatch) -> pa.RecordBatch:
        import pyarrow as pa

        schema = self.arrow_schema
        read = dict(zip(self.columns.read, raw.columns, strict=True))
        derived: dict[str, pa.Array] = {}
        if self.columns.decodes:
            struct = (schema.field(self.columns.decoded).type if self.columns.decoded is not None
                      else pa.struct([]))
            ser_id, manifest, payload = (read[c] for c in self.columns.serialized)
            events, flags = self.decoder.decode(ser_id, manifest, payload, read[KEY_COLUMN], struct)
            derived = {self.columns.decoded or "": events, REDACTED: flags}
        arrays = []
        for target in schema:
            array = derived.get(target.name)
            if array is None:
                array = read[target.name]
            arrays.append(array if array.type == target.type else array.cast(target.type))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def bind(query: str, params: Mapping[str, Any]) -> str:
    """``query`` with its ``%(name)s`` placeholders replaced by SQL literals (psycopg's quoting).

    A ``COPY`` takes no bound parameters, so its values are quoted client-side, as psycopg does for
    ``cursor.copy(query, params)``: a value never reaches the text unquoted."""
    from psycopg import sql

    names = set(_PLACEHOLDER.findall(query))
    missing = names - set(params)
    if missing:
        raise KeyError(f"no value for placeholder(s) {', '.join(sorted(missing))}")
    template = _PLACEHOLDER.sub(r"{\1}", query.replace("{", "{{").replace("}", "}}")).replace("%%", "%")
    return sql.SQL(template).format(**{n: sql.Literal(params[n]) for n in names}).as_string(None)


#: One idle connection per connection string in this process (a Python worker runs one task at a time and is
#: reused across tasks): connecting costs client CPU (the driver loads the server's type catalog),
#: about what a small micro-batch's read costs altogether (``python -m bench spark-source-latency``).
_IDLE: dict[str, Any] = {}


@atexit.register
def _close_idle() -> None:
    """Close the kept connections before the interpreter tears the driver's module down (a connection left
    to its finalizer then fails noisily)."""
    while _IDLE:
        with contextlib.suppress(Exception):
            _IDLE.popitem()[1].close()


def _connect(conninfo: str, dsn: str) -> Any:
    import adbc_driver_postgresql.dbapi as adbc

    try:
        conn = adbc.connect(conninfo, autocommit=True)  # no transaction left open between tasks
    except adbc.Error as exc:
        raise DatabaseUnavailable(f"cannot connect to {mask_dsn(dsn)}: {_reason(exc, conninfo, dsn)}") from None
    with conn.cursor() as cur:
        cur.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    return conn


def stream_rows(dsn: str, query: str, params: Mapping[str, Any], converter: ArrowRows, batch_rows: int
                ) -> Iterator[pa.RecordBatch]:
    """``query`` in a read-only session through the ADBC driver (a binary COPY), as record batches of at
    most ``batch_rows`` rows of the read's schema. The connection is kept for the process's next task when
    the rows were read to the end; a kept connection that fails before its first row is replaced once."""
    import adbc_driver_postgresql.dbapi as adbc
    import psycopg.conninfo

    from pgjournal.server.connections import connection_kwargs
    from pgjournal.settings import Settings

    text = bind(query, params)
    conninfo = psycopg.conninfo.make_conninfo(dsn, **connection_kwargs(Settings.load()))
    conn, reused = _IDLE.pop(conninfo, None), True
    if conn is None:
        conn, reused = _connect(conninfo, dsn), False
    done = False
    try:
        while True:
            try:
                cur = conn.cursor()
                cur.execute(text)
                reader = cur.fetch_record_batch()
                break
            except adbc.OperationalError:
                if not reused:
                    raise
                conn.close()  # the kept connection went stale (server restart, idle timeout): connect anew
                conn, reused = _connect(conninfo, dsn), False
        for raw in reader:
            for offset in range(0, raw.num_rows, batch_rows):
                yield converter.convert(raw.slice(offset, batch_rows))
        cur.close()
        done = True
    except adbc.OperationalError as exc:
        raise DatabaseUnavailable(f"lost the connection to {mask_dsn(dsn)}: {_reason(exc, conninfo, dsn)}") from None
    finally:
        if done and conninfo not in _IDLE:
            _IDLE[conninfo] = conn
        else:
            conn.close()


def _reason(exc: BaseException, conninfo: str, dsn: str) -> str:
    """The driver's message, without the password of either connection string (it may quote them)."""
    return redact(redact(" ".join(str(exc).split()) or type(exc).__name__, conninfo), dsn)
