"""Key stores for payload encryption (:mod:`pgjournal.codec.transcoding`): one AES-256 data key per persistence id.

The interface (:class:`KeyStore`) is three thread-safe methods:

* ``key(persistence_id) -> bytes | None``: the persistence id's 32-byte key, ``None`` when it has none (never
  written, or deleted: readers then deliver its payloads as redacted);
* ``create_key(persistence_id) -> bytes``: its key, made and stored first when it has none; two processes
  creating the key of one persistence id at once must end up with the same key;
* ``delete_key(persistence_id) -> bool``: forget the key for good (crypto-shredding); ``True`` if there was one.

Two implementations: :class:`InMemoryKeyStore` (tests, short-lived tools) and :class:`PostgresKeyStore`, which
keeps each data key *wrapped* (encrypted) by a key-encryption key in ``pgjournal_payload_keys``, so a copy of
the database alone reads nothing. The wrapping is a :class:`KeyWrapper`: :class:`AesGcmKeyWrapper` with a
32-byte master key the application holds, or your own. A KMS-backed store needs only a wrapper whose ``wrap``
and ``unwrap`` call the KMS's encrypt and decrypt (envelope encryption: the KMS never sees payloads, one KMS
call per persistence id per cache period); or implement :class:`KeyStore` directly over the KMS's own key
storage. Either way, deleting the key row (or the KMS key) is what shreds.

Caching: :class:`PostgresKeyStore` keeps keys (and their absence) for ``cache_ttl`` seconds. A key deleted
through one store is forgotten by that store at once; other processes keep using a cached copy for at most
``cache_ttl``, so shred a persistence id once nothing writes to it any more.
"""

from __future__ import annotations

import atexit
import contextlib
import pickle
import threading
import time
from collections import OrderedDict
from typing import Any, Protocol, runtime_checkable

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from pgjournal.codec.transcoding import KeyStore as KeyStore  # the contract, defined where keys are used
from pgjournal.codec.transcoding import check_key, new_key, open_sealed, seal
from pgjournal.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    DecryptionError,
    InsufficientPrivilege,
    RetriesExhausted,
    SchemaNotMigrated,
)
from pgjournal.runtime.backoff import Backoff
from pgjournal.runtime.contention import TRANSIENT_ERRORS
from pgjournal.server.connections import connection_kwargs
from pgjournal.server.dsn import mask_dsn, redact, resolve_dsn
from pgjournal.settings import Settings
from pgjournal.store import keys as sql
from pgjournal.store.catalog import lock_timeout
from pgjournal.validation import check_persistence_id


@runtime_checkable
class KeyWrapper(Protocol):
    """Encrypts data keys for storage (a master key, or a KMS)."""

    def wrap(self, key: bytes, persistence_id: str) -> bytes: ...

    def unwrap(self, wrapped: bytes, persistence_id: str) -> bytes: ...


class InMemoryKeyStore:
    """Keys in a dict of this process: gone when it exits. For tests and tools."""

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def key(self, persistence_id: str) -> bytes | None:
        return self._keys.get(persistence_id)

    def create_key(self, persistence_id: str) -> bytes:
        with self._lock:
            return self._keys.setdefault(check_persistence_id(persistence_id), new_key())

    def delete_key(self, persistence_id: str) -> bool:
        with self._lock:
            return self._keys.pop(check_persistence_id(persistence_id), None) is not None

    def __len__(self) -> int:
        return len(self._keys)

    def __getstate__(self) -> dict[str, bytes]:
        # a pickled copy (a Spark task's, say) holds the keys of the moment it was pickled, and only those
        with self._lock:
            return dict(self._keys)

    def __setstate__(self, keys: dict[str, bytes]) -> None:
        self._keys = dict(keys)
        self._lock = threading.Lock()


_WRAP_ASSOCIATED = b"pgjournal payload key\x00"


class AesGcmKeyWrapper:
    """Wraps data keys with AES-256-GCM under ``master_key`` (32 bytes), bound to their persistence id."""

    def __init__(self, master_key: bytes) -> None:
        self._master = check_key(master_key, "master_key")

    def wrap(self, key: bytes, persistence_id: str) -> bytes:
        return seal(self._master, key, _WRAP_ASSOCIATED + persistence_id.encode("utf-8"))

    def unwrap(self, wrapped: bytes, persistence_id: str) -> bytes:
        return open_sealed(self._master, bytes(wrapped), _WRAP_ASSOCIATED + persistence_id.encode("utf-8"))


_ABSENT = b""
_RETRIES = 5
#: Seconds :meth:`PostgresKeyStore.reclaim` waits for transactions that may still see a deleted key to end.
RECLAIM_WAIT = 10.0
#: Between the reclaim's tries: 50 ms, doubling to 1 s.
RECLAIM_BACKOFF = Backoff(0.05, 2.0, 1.0)
#: Seconds a VACUUM of the key table waits in the lock queue before it steps aside (key lookups wait behind it).
LOCK_WAIT = 0.1


class PostgresKeyStore:
    """Data keys in ``pgjournal_payload_keys`` (run ``pgjournal migrate``), wrapped by ``master_key`` (32 bytes)
    or by ``wrapper`` (a :class:`KeyWrapper`, e.g. one calling a KMS). ``dsn``: the journal's database (default:
    the embedded server, as :meth:`pgjournal.Journal.open`). ``close()`` (or ``with``) releases its connections.

    Pickled (to Spark's Python workers, say) it travels as what reopens it: the DSN, the wrapper (with the master
    key: pickle it only to processes that may hold that key) and the cache settings; it is unpickled as
    :meth:`shared` would give it.
    """

    def __init__(self, dsn: str | None = None, *, master_key: bytes | None = None,
                 wrapper: KeyWrapper | None = None, cache_ttl: float = 30.0, cache_size: int = 100_000,
                 pool_max_size: int = 4, **settings: Any) -> None:
        if (master_key is None) == (wrapper is None):
            raise ConfigurationError("PostgresKeyStore needs exactly one of master_key (32 bytes) or wrapper (a "
                                     "KeyWrapper): data keys are never stored in the clear")
        self._wrapper: KeyWrapper = wrapper if wrapper is not None else AesGcmKeyWrapper(master_key)  # type: ignore
        if not all(callable(getattr(self._wrapper, m, None)) for m in ("wrap", "unwrap")):
            raise ConfigurationError(f"wrapper must have wrap and unwrap, got {type(self._wrapper).__name__}")
        if isinstance(cache_ttl, bool) or not isinstance(cache_ttl, int | float) or not 0 <= cache_ttl <= 86_400:
            raise ConfigurationError(f"cache_ttl must be a number of seconds from 0 to 86,400, got {cache_ttl!r}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ConfigurationError(f"cache_size must be a positive integer, got {cache_size!r}")
        loaded = Settings.load(**settings)
        self.dsn = resolve_dsn(dsn)
        self._reopen_with = (self.dsn, self._wrapper, cache_ttl, cache_size, pool_max_size, settings)
        self._ttl = float(cache_ttl)
        self._size = cache_size
        self._cache: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ConnectionPool(self.dsn, min_size=1, max_size=max(1, pool_max_size),
                                    kwargs={"autocommit": True, **connection_kwargs(loaded, statement_timeout=True,
                                                                                       dsn=self.dsn)},
                                    timeout=loaded.connect_timeout, name="pgjournal-keys", open=False)
        self._pool.open(wait=False)

    @classmethod
    def shared(cls, dsn: str | None = None, *, master_key: bytes | None = None, wrapper: KeyWrapper | None = None,
               cache_ttl: float = 30.0, cache_size: int = 100_000, pool_max_size: int = 4,
               **settings: Any) -> PostgresKeyStore:
        """One store per set of arguments in this process, made on first use and closed at exit: for code
        that cannot hold on to a store between calls (each Spark task unpickles its own copy of a reader)."""
        if master_key is not None and wrapper is None:
            wrapper = AesGcmKeyWrapper(master_key)
            master_key = None
        args = (resolve_dsn(dsn), wrapper, cache_ttl, cache_size, pool_max_size, tuple(sorted(settings.items())))
        try:
            spec = pickle.dumps((type(wrapper), getattr(wrapper, "__dict__", None), *args[:1], *args[2:]))
        except Exception:  # a wrapper that does not pickle: never shared
            spec = None
        with _SHARED_LOCK:
            store = _SHARED.get(spec) if spec is not None else None
            if store is None:
                store = cls(args[0], master_key=master_key, wrapper=wrapper, cache_ttl=cache_ttl,
                            cache_size=cache_size, pool_max_size=pool_max_size, **settings)
                if spec is not None:
                    _SHARED[spec] = store
            return store

    def __reduce__(self) -> tuple[Any, ...]:
        dsn, wrapper, cache_ttl, cache_size, pool_max_size, settings = self._reopen_with
        return _reopen, (dsn, wrapper, cache_ttl, cache_size, pool_max_size, settings)

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> PostgresKeyStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- the KeyStore interface --------------------------------------------------------------------------

    def key(self, persistence_id: str) -> bytes | None:
        cached = self._cached(persistence_id)
        if cached is not None:
            return cached or None
        row = self._run(sql.get(persistence_id), one=True)
        key = self._unwrap(row[0], persistence_id) if row else None
        self._remember(persistence_id, key)
        return key

    def create_key(self, persistence_id: str) -> bytes:
        cached = self._cached(persistence_id)
        if cached:
            return cached
        pid = check_persistence_id(persistence_id)
        fresh = new_key()
        if self._run(sql.insert(pid, self._wrapper.wrap(fresh, pid)), one=True) is not None:
            key = fresh
        else:  # another writer stored one first: use that
            row = self._run(sql.get(pid), one=True)
            if row is None:  # ... and it was deleted in between: try again
                return self.create_key(pid)
            key = self._unwrap(row[0], pid)
        self._remember(pid, key)
        return key

    def delete_key(self, persistence_id: str) -> bool:
        """Delete the key and rewrite the key table, so its bytes leave the table's file too (a wrapped key kept
        there would open the payloads again to whoever later gets the master key). Raises
        :class:`InsufficientPrivilege` or :class:`RetriesExhausted` when the key is deleted but its bytes could not be
        taken out of the file (see :meth:`reclaim`)."""
        pid = check_persistence_id(persistence_id)
        deleted = self._run(sql.delete(pid), rowcount=True)
        with self._lock:
            self._cache.pop(pid, None)
        if deleted:
            self.reclaim(pid)
        return bool(deleted)

    # -- helpers -------------------------------------------------------------------------------------

    def reclaim(self, persistence_id: str | None = None) -> None:
        """Rewrite the key table so the bytes of deleted keys leave its file (:meth:`delete_key` does this; see
        :mod:`pgjournal.store.keys` for how).

        A transaction that began before a key was deleted may still see its row, and a rewrite keeps what it may
        see: the key store waits for such transactions for up to :data:`RECLAIM_WAIT` seconds, then raises
        :class:`RetriesExhausted` (the bytes stay until they end and this runs again). The same for a session that
        holds any lock on the table (the rewrite needs it alone): the rewrite queues :data:`LOCK_WAIT` at a time, so
        key lookups never wait long behind it, and the error names that session. Raises
        :class:`InsufficientPrivilege` when the role may not vacuum the table."""
        what = f"the key of persistence id {persistence_id!r} is deleted, but " if persistence_id else ""
        may_vacuum, since = self._run(sql.may_vacuum(), one=True)
        if not may_vacuum:
            raise InsufficientPrivilege(
                f"{what}this role may not vacuum {sql.TABLE} (grant it MAINTAIN on the table, PostgreSQL 17+, as "
                f"`pgjournal roles` does): the wrapped bytes of deleted keys stay in the table's file until its "
                f"owner runs VACUUM {sql.TABLE}; VACUUM (FULL) {sql.TABLE}")
        started = time.monotonic()
        deadline, tries = started + RECLAIM_WAIT, 0
        while True:
            tries += 1
            pause = RECLAIM_BACKOFF.delay(tries)
            vacuumed = self._vacuum(sql.VACUUM)
            if vacuumed and not self._run(sql.dead_rows(), one=True)[0]:
                if self._vacuum(sql.REWRITE):
                    return
                vacuumed = False  # the rewrite's lock was held
            if time.monotonic() + pause > deadline:
                if not vacuumed:
                    holders = ", ".join(f"backend {pid} (role {role!r})" for pid, role in
                                        self._run(sql.lockers(since)))
                    raise RetriesExhausted(
                        f"{what}another session holds a lock on {sql.TABLE} ({holders or 'gone since'}), so the "
                        f"table could not be rewritten and the deleted keys' bytes stay in its file (waited "
                        f"{RECLAIM_WAIT:.0f} s); run the key store's reclaim() once that transaction ended")
                raise RetriesExhausted(
                    f"{what}a transaction older than the deletion may still see a deleted key, so its bytes stay in "
                    f"{sql.TABLE}'s file (waited {RECLAIM_WAIT:.0f} s); run the key store's reclaim() once such "
                    "transactions ended")
            time.sleep(pause)

    def _vacuum(self, statement: tuple[str, tuple[Any, ...]]) -> bool:
        """Run a VACUUM of the key table, waiting at most :data:`LOCK_WAIT` for its lock; ``False`` when another
        session held a conflicting one. A rewrite's ACCESS EXCLUSIVE request waiting in the lock queue would stop
        every key lookup and append behind it for as long as the holder (any role that may connect can take a
        lock on the table without a right to it) keeps its transaction open; so it queues briefly, steps
        aside and tries again."""
        try:
            self._run(statement, rowcount=True, lock_wait=LOCK_WAIT)
        except psycopg.errors.LockNotAvailable:
            return False
        return True

    def _unwrap(self, wrapped: bytes, pid: str) -> bytes:
        try:
            return check_key(self._wrapper.unwrap(bytes(wrapped), pid), "an unwrapped key")
        except (ValueError, ConfigurationError) as exc:
            raise DecryptionError(f"cannot unwrap the payload key of persistence id {pid!r}: {exc}; is this the "
                                  "master key (wrapper) the keys were stored with?", persistence_id=pid) from None

    def _cached(self, pid: str) -> bytes | None:
        """The cached key, ``b""`` for a cached absence, ``None`` when not cached (or expired)."""
        with self._lock:
            entry = self._cache.get(pid)
            if entry is None:
                return None
            if entry[1] < time.monotonic():
                del self._cache[pid]
                return None
            self._cache.move_to_end(pid)
            return entry[0]

    def _remember(self, pid: str, key: bytes | None) -> None:
        if self._ttl <= 0:
            return
        with self._lock:
            self._cache[pid] = (key or _ABSENT, time.monotonic() + self._ttl)
            self._cache.move_to_end(pid)
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)

    def _run(self, query: tuple[str, tuple[Any, ...]], *, one: bool = False, rowcount: bool = False,
             lock_wait: float | None = None) -> Any:
        """Run one statement (its own transaction); serialization failures and deadlocks (SERIALIZABLE databases
        such as CockroachDB) are tried again: every statement of the store may run twice. ``lock_wait``: seconds
        the statement may wait for a lock, else :class:`psycopg.errors.LockNotAvailable` is raised."""
        for attempt in range(1, _RETRIES + 2):
            try:
                with self._pool.connection() as conn:
                    if lock_wait is None:
                        cur = conn.execute(*query)
                        return cur.rowcount if rowcount else cur.fetchone() if one else cur.fetchall()
                    conn.execute(*lock_timeout(lock_wait, local=False))
                    try:
                        cur = conn.execute(*query)
                        return cur.rowcount if rowcount else cur.fetchone() if one else cur.fetchall()
                    finally:
                        conn.execute("RESET lock_timeout")
            except psycopg.errors.LockNotAvailable:
                raise
            except PoolTimeout:
                raise DatabaseUnavailable(f"key store: no connection to {mask_dsn(self.dsn)}") from None
            except psycopg.errors.UndefinedTable:
                raise SchemaNotMigrated(f"the database has no {sql.TABLE} table; run `pgjournal migrate`") from None
            except TRANSIENT_ERRORS as exc:
                if attempt > _RETRIES:
                    raise RetriesExhausted(f"the key store's statement failed {attempt} times with SQLSTATE "
                                           f"{exc.sqlstate}; nothing was changed") from exc
            except psycopg.OperationalError as exc:
                raise DatabaseUnavailable(f"key store: lost the connection to {mask_dsn(self.dsn)}: "
                                          f"{redact(' '.join(str(exc).split()), self.dsn)}") from None
        raise AssertionError("unreachable")


_SHARED: dict[bytes, PostgresKeyStore] = {}
_SHARED_LOCK = threading.Lock()


def _reopen(dsn: str, wrapper: KeyWrapper, cache_ttl: float, cache_size: int, pool_max_size: int,
            settings: dict[str, Any]) -> PostgresKeyStore:
    """A pickled :class:`PostgresKeyStore`, unpickled (:meth:`PostgresKeyStore.shared`)."""
    return PostgresKeyStore.shared(dsn, wrapper=wrapper, cache_ttl=cache_ttl, cache_size=cache_size,
                                   pool_max_size=pool_max_size, **settings)


@atexit.register
def _close_shared() -> None:
    while _SHARED:
        with contextlib.suppress(Exception):
            _SHARED.popitem()[1].close()
