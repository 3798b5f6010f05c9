"""The asyncio twin of :class:`pgjournal.connections.LimitedConnection`: a pool connection that gives up on an
answer after the round-trip limit (``statement_timeout + tcp_user_timeout``) and is closed, raising
:class:`~pgjournal.connections.ServerSilent`."""

from __future__ import annotations

from typing import Any

import psycopg

from ..connections import _WAIT_TIMEOUT, ServerSilent, round_trip_limit
from ..settings import Settings


class AsyncLimitedConnection(psycopg.AsyncConnection[Any]):
    limit: float | None = None

    async def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        limit = self.limit
        if limit is None or timeout is not None or _WAIT_TIMEOUT is None:
            return await super().wait(gen, interval, timeout)
        try:
            return await super().wait(gen, interval, limit)
        except _WAIT_TIMEOUT:
            self.pgconn.finish()  # the protocol state is unknown mid-exchange
            raise ServerSilent(limit) from None


def async_limited_connection_class(settings: Settings) -> type[AsyncLimitedConnection]:
    return type("AsyncLimitedConnection", (AsyncLimitedConnection,), {"limit": round_trip_limit(settings)})
