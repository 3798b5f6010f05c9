"""Settings, parsed and checked in one place. Every setting can come from ``PGJOURNAL_<NAME>``."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from pgjournal.errors import ConfigurationError
from pgjournal.runtime.contention import RetryPolicy
from pgjournal.validation import check_name

ENV_PREFIX = "PGJOURNAL_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Settings:
    """Defaults follow Akka Persistence R2DBC; durations are seconds."""

    #: ``postgres``, ``yugabyte`` or ``cockroach``: the SQL and DDL flavour.
    dialect: str = "postgres"
    #: Use no PostgreSQL-only feature (notifications, visibility horizon): the YugabyteDB/CockroachDB path.
    portable: bool = False
    pool_min_size: int = 1
    pool_max_size: int = 16
    #: Seconds to wait for a connection before the server counts as unreachable.
    connect_timeout: float = 10.0
    #: Server-side limit on pgjournal's own statements (its pool connections; 0: none). Each answer on a
    #: pool connection is also awaited at most statement_timeout + tcp_user_timeout (client side).
    statement_timeout: float = 30.0
    #: Sent data unacknowledged this long, or keepalive probes unanswered, drop the connection (0: OS default).
    tcp_user_timeout: float = 30.0
    #: Failed polls in a row after which a live query gives up with DatabaseUnavailable (backoff 0.1-5 s).
    live_query_retries: int = 60
    #: Rows per query page.
    buffer_size: int = 1000
    #: Rows per by-slice page while a query is behind (its previous page was full): a catch-up reads few
    #: large pages instead of many small ones; the page is held in memory, so this bounds what a reader holds.
    catchup_buffer_size: int = 10_000
    #: Live queries poll at least this often.
    refresh_interval: float = 3.0
    #: Live queries read only rows older than the database clock minus this (portable mode; on PostgreSQL
    #: the visibility horizon replaces it, see ``horizon_margin``).
    behind_current_time: float = 0.1
    #: With the visibility horizon (PostgreSQL, not portable): the clock margin kept besides the oldest open
    #: transaction, covering the instant between a transaction taking its timestamp and announcing it.
    horizon_margin: float = 0.01
    #: Readers on a standby (``Journal.open(dsn, replica=...)``): how long a poll waits for the standby to replay
    #: the primary's newest horizon before it reads below an older one (pgjournal.core.replica).
    replica_replay_wait: float = 0.1
    #: A journal opened on a hot standby itself (no primary named): live by-slice reads there anyway. Off, they are
    #: refused (``ConfigurationError``): the standby shows none of the primary's writers, so a commit later than the
    #: backtracking window is never delivered; ``Journal.open(primary, replica=standby)`` reads it safely.
    standby_live_reads: bool = False
    #: A sharded journal whose write is refused by a moved range's guard waits at most this long for the
    #: databases' layout records to agree on the new layout before it raises (pgjournal.shards.routing).
    layout_wait: float = 5.0
    backtracking_enabled: bool = True
    #: How far behind the main cursor backtracking re-reads.
    backtracking_window: float = 120.0
    #: Backtracking reads only rows older than the database clock minus this.
    backtracking_behind_current_time: float = 10.0
    #: Writers signal live queries after commit (PostgreSQL LISTEN/NOTIFY; off in portable mode).
    notify: bool = True
    #: Identifies this Journal's writes in the ``writer`` column; a random id when not set.
    writer_id: str = ""
    #: How often a write is tried again after a transient failure: a serialization failure (40001), a
    #: deadlock (40P01), or another process's append to the same persistence id when ``expected_seq_nr`` is
    #: None. Appends from threads of one process to one persistence id never collide (they take turns).
    append_retries: int = 10
    #: The pause before the first retry; it doubles with each retry up to ``retry_backoff_max``, with jitter
    #: (a random pause between half and all of it). Defaults: at most ~1 s of pauses over 10 retries.
    retry_backoff: float = 0.002
    retry_backoff_max: float = 0.25
    #: AsyncJournal: appends that would wait for a pool connection are sent together in one pipeline and one
    #: transaction (group commit, pgjournal.aio.pipelining), each keeping its own outcome; off: each waits for a
    #: connection of its own.
    async_pipeline: bool = True
    #: Journal: appends of threads that would wait for a pool connection ride together in one pipeline and one
    #: transaction (group commit, pgjournal.write.pipelining), each keeping its own outcome; off: each waits for a
    #: connection of its own.
    pipeline: bool = True
    # -- Cassandra-compatible tag path (events_by_tag); names and defaults follow the Cassandra plugin --
    #: Day, Hour or Minute: fixed once tagged events exist (recorded in the database).
    tag_bucket_size: str = "Hour"
    #: Where an events_by_tag query without offset starts: yyyyMMdd'T'HH:mm in UTC (Hour/Day: shorter forms).
    tag_first_time_bucket: str = "20151120T00:00"
    #: events_by_tag reads only events older than now minus this.
    tag_eventual_consistency_delay: float = 5.0
    #: How long events_by_tag searches for a missing tag sequence number before MissingEventsError.
    tag_gap_timeout: float = 10.0
    #: How long a persistence id met for the first time with a tag sequence number > 1 is searched for its
    #: lower numbers (live queries started in the current bucket); 0: accept it at once.
    tag_new_persistence_id_scan_timeout: float = 0.2
    #: Short back track: every interval seconds, re-read the last period seconds behind the cursor (of them, what
    #: the cursor passed within period seconds of the bound it read under: a row is assumed visible by then).
    tag_back_track_interval: float = 1.0
    tag_back_track_period: float = 5.0
    #: Long back track: every long interval seconds over the long period (seconds, or "max": from the start
    #: of the previous bucket).
    tag_back_track_long_interval: float = 120.0
    tag_back_track_long_period: float | str = "max"
    #: Which tag writer writes the tag view rows (pgjournal.write.tag_batcher, docs/tags.md). True: the batched tag
    #: writer (a tagged append writes only its event, the ``tags`` column; a thread or task of the journal writes
    #: the tag view rows and progress later, many per statement, from the journal). False: the in-statement
    #: writer (the tag rows in the append's own statement). None (the default): what the database records
    #: (``tag_settings`` ``tag_writer``); with nothing recorded, in-statement if tag rows exist (written by a
    #: version that recorded nothing, whose default was in-statement), else batched. Opening resolves it.
    tag_batch_writer: bool | None = None
    #: The batched tag writer writes what is pending at least this often (seconds).
    tag_flush_interval: float = 0.1
    #: At most this many events per tag view statement of the batched writer; this many pending start a write.
    tag_batch_size: int = 500
    #: A batched tag writer silent this long (no heartbeat) is presumed dead: other batched writers, and
    #: ``pgjournal tags recover``, write its pending tag rows. Must exceed the longest pause of a writer process.
    tag_writer_timeout: float = 10.0

    def __post_init__(self) -> None:
        from pgjournal.dialects import get_dialect

        get_dialect(self.dialect)
        positive = ("pool_min_size", "pool_max_size", "buffer_size", "catchup_buffer_size", "tag_batch_size")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"setting {name} must be a positive integer, got {value!r}")
        if self.pool_min_size > self.pool_max_size:
            raise ConfigurationError(
                f"setting pool_min_size ({self.pool_min_size}) exceeds pool_max_size ({self.pool_max_size})"
            )
        for name in ("append_retries", "live_query_retries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"setting {name} must be an integer >= 0, got {value!r}")
        durations = ("connect_timeout", "statement_timeout", "tcp_user_timeout", "refresh_interval",
                     "behind_current_time", "horizon_margin", "replica_replay_wait", "layout_wait",
                     "backtracking_window",
                     "backtracking_behind_current_time", "retry_backoff", "retry_backoff_max")
        for name in durations:
            _check_seconds(name, getattr(self, name))
        for name in ("portable", "backtracking_enabled", "notify", "async_pipeline", "pipeline"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(f"setting {name} must be true or false, got {getattr(self, name)!r}")
        if self.tag_batch_writer is not None and not isinstance(self.tag_batch_writer, bool):
            raise ConfigurationError("setting tag_batch_writer must be true, false or None (follow the database), "
                                     f"got {self.tag_batch_writer!r}")
        if self.refresh_interval <= 0:
            raise ConfigurationError(f"setting refresh_interval must be > 0 seconds, got {self.refresh_interval!r}")
        self._check_tag_settings()
        if self.writer_id != "":  # "": a new random one per journal
            check_name(self.writer_id, "setting writer_id", error=ConfigurationError)

    def _check_tag_settings(self) -> None:
        from pgjournal.buckets import BucketSize, parse_first_time_bucket

        parse_first_time_bucket(self.tag_first_time_bucket, BucketSize.parse(self.tag_bucket_size))
        tag_durations = ("tag_eventual_consistency_delay", "tag_gap_timeout", "tag_new_persistence_id_scan_timeout",
                         "tag_back_track_interval", "tag_back_track_period", "tag_back_track_long_interval",
                         "tag_flush_interval", "tag_writer_timeout")
        for name in tag_durations:
            _check_seconds(name, getattr(self, name))
        if self.tag_flush_interval <= 0:
            raise ConfigurationError(f"setting tag_flush_interval must be > 0 seconds, got {self.tag_flush_interval!r}")
        if self.tag_writer_timeout < 4 * self.tag_heartbeat_interval:
            raise ConfigurationError(
                f"setting tag_writer_timeout ({self.tag_writer_timeout!r} s) must be at least 4 heartbeats of the "
                f"batched tag writer ({4 * self.tag_heartbeat_interval:g} s: tag_flush_interval, at most 1 s, at "
                "least a quarter of tag_eventual_consistency_delay)")
        if self.tag_back_track_long_period_seconds is None and not (
                isinstance(self.tag_back_track_long_period, str)
                and self.tag_back_track_long_period.strip().lower() == "max"):
            raise ConfigurationError(f"setting tag_back_track_long_period must be a number of seconds >= 0 or "
                                     f"'max', got {self.tag_back_track_long_period!r}")

    @property
    def retry_policy(self) -> RetryPolicy:
        """How a write retries (``append_retries``, ``retry_backoff``, ``retry_backoff_max``)."""
        return RetryPolicy(self.append_retries, self.retry_backoff, self.retry_backoff_max)

    @property
    def batched_tags(self) -> bool:
        """Whether the batched tag writer writes this journal's tag rows (``tag_batch_writer``, which opening
        resolves; unresolved None is the default, batched)."""
        return self.tag_batch_writer is not False

    @property
    def tag_heartbeat_interval(self) -> float:
        """How often an idle batched tag writer advances its watermark: readers wait for it, so often enough
        to stay within the eventual consistency delay, and at least every ``tag_flush_interval``."""
        return max(self.tag_flush_interval, min(1.0, self.tag_eventual_consistency_delay / 4))

    @property
    def tag_back_track_long_period_seconds(self) -> float | None:
        """The long back-track period in seconds; ``None`` for "max" (from the start of the previous bucket)."""
        value = self.tag_back_track_long_period
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_SECONDS:
            return None
        return float(value)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """Defaults, then ``PGJOURNAL_<NAME>`` variables, then ``overrides`` (``None`` means: not given)."""
        unknown = sorted(set(overrides) - set(cls.names()))
        if unknown:
            raise ConfigurationError(
                f"unknown setting(s) {', '.join(unknown)}; known settings: {', '.join(cls.names())}"
            )
        values: dict[str, Any] = {}
        for field in fields(cls):
            raw = os.environ.get(ENV_PREFIX + field.name.upper())
            if raw is not None:
                values[field.name] = _parse(field.name, field.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def uses_notifications(self) -> bool:
        from pgjournal.dialects import get_dialect

        return self.notify and not self.portable and get_dialect(self.dialect).supports_notify


#: No duration setting needs more than a day; infinity or a year would overflow time arithmetic later.
MAX_SECONDS = 86_400.0


def _check_seconds(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_SECONDS:
        raise ConfigurationError(f"setting {name} must be a number of seconds from 0 to {MAX_SECONDS:,.0f}, "
                                 f"got {value!r}")


def _parse(name: str, type_name: Any, raw: str) -> Any:
    kind = str(type_name)
    try:
        if kind in ("bool", "bool | None"):
            lowered = raw.strip().lower()
            if lowered in _TRUE | _FALSE:
                return lowered in _TRUE
            if kind == "bool | None" and lowered in ("", "none", "auto"):
                return None
            raise ValueError
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        raise ConfigurationError(
            f"environment variable {ENV_PREFIX + name.upper()}={raw!r} is not a valid {kind}"
        ) from None
    return raw
