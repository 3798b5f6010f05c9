"""Directory operations through Hadoop's FileSystem, so output paths may be local, HDFS or object stores.

PySpark has no public API to Hadoop's FileSystem: it is reached through the session's JVM gateway
(``SparkContext._jvm`` and ``_jsc``, private). Where a session has none (Spark Connect, or a PySpark that
drops those attributes), local paths are handled by Python itself and other schemes are refused by name.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from pgjournal.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _hadoop(spark: SparkSession, path: str) -> tuple[Any, Any] | None:
    """Hadoop's FileSystem of ``path`` and its Path, or ``None`` where the session has no JVM gateway."""
    try:
        context = spark.sparkContext
    except Exception:  # Spark Connect sessions have no SparkContext
        return None
    jvm, jsc = getattr(context, "_jvm", None), getattr(context, "_jsc", None)
    if jvm is None or jsc is None:
        return None
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    return hpath.getFileSystem(jsc.hadoopConfiguration()), hpath


def _local(path: str) -> Path:
    """``path`` as a local path (no scheme, or ``file:``); another scheme needs Hadoop's FileSystem."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else path)
    raise ConfigurationError(f"output path {path!r} needs Hadoop's FileSystem, which this Spark session does not "
                             "reach (no JVM gateway, e.g. Spark Connect); give a local path")


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def list_names(spark: SparkSession, path: str) -> list[str]:
    """Names of the entries directly under ``path`` (empty when it does not exist)."""
    hadoop = _hadoop(spark, path)
    if hadoop is None:
        local = _local(path)
        return sorted(os.listdir(local)) if local.is_dir() else []
    fs, hpath = hadoop
    if not fs.exists(hpath):
        return []
    return sorted(status.getPath().getName() for status in fs.listStatus(hpath))


def exists(spark: SparkSession, path: str) -> bool:
    hadoop = _hadoop(spark, path)
    if hadoop is None:
        return _local(path).exists()
    fs, hpath = hadoop
    return bool(fs.exists(hpath))


def delete(spark: SparkSession, path: str) -> None:
    hadoop = _hadoop(spark, path)
    if hadoop is None:
        local = _local(path)
        if local.is_dir() and not local.is_symlink():
            shutil.rmtree(local)
        else:
            local.unlink(missing_ok=True)
        return
    fs, hpath = hadoop
    fs.delete(hpath, True)


def rename(spark: SparkSession, source: str, target: str) -> None:
    """Move ``source`` to ``target`` (atomic on local disks and HDFS); the parent of ``target`` is created."""
    hadoop = _hadoop(spark, source)
    if hadoop is None:
        destination = _local(target)
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.rename(_local(source), destination)
        return
    fs, src = hadoop
    hadoop_target = _hadoop(spark, target)
    assert hadoop_target is not None  # the same session, the same gateway
    dst = hadoop_target[1]
    fs.mkdirs(dst.getParent())
    if not fs.rename(src, dst):
        raise OSError(f"could not rename {source} to {target}")
