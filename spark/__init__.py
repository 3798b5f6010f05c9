"""Spark readers and jobs for the journal: JDBC (:mod:`spark.read`, :mod:`spark.jobs`) and the native
``format("pgjournal")`` data source (:mod:`spark.source`, :mod:`spark.stream`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pgjournal.codec.serialization import SerializerRegistry


def register(spark: SparkSession, *, serializers: SerializerRegistry | None = None) -> None:
    """Make ``spark.read.format("pgjournal")`` and ``spark.readStream.format("pgjournal")`` available, decoding
    payloads with ``serializers`` (the journal's registry: see :func:`spark.datasource.register`)."""
    from .datasource import register as register_source

    register_source(spark, serializers=serializers)
