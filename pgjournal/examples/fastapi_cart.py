"""The shopping cart (:mod:`pgjournal.examples.shopping_cart`) as an HTTP service on the asyncio face, with a
live server-sent-events feed of a slice range. Needs the ``web`` extra (``pip install "pgjournal[web]"``)::

    python -m pgjournal.examples.fastapi_cart --port 8000        # the embedded server, or --dsn / PGJOURNAL_DSN
    curl -X POST localhost:8000/carts/c1/items -H 'content-type: application/json' \\
         -d '{"item_id": "socks", "quantity": 2}'
    curl -N 'localhost:8000/events?min_slice=0&max_slice=1023'   # every cart event, live

Routes: ``GET /carts/{id}``; ``POST /carts/{id}/items`` (add), ``PUT /carts/{id}/items/{item}`` (adjust),
``DELETE /carts/{id}/items/{item}`` (remove), ``POST /carts/{id}/checkout``; each answers the cart and its
``seq_nr``. A command the cart's rules refuse, or another writer's that got there first, is ``409 Conflict``
(nothing was written); bad input (a cart id over 255 characters, a bad offset) ``400`` naming it, a bad body
``422`` naming each field and rule; a database that cannot be reached, or any other failure of the journal,
``503`` with ``Retry-After`` and a body that says only what kind of failure it was (the connection string and
the driver's message go to the log).
``GET /events`` streams ``events_by_slices("cart", min_slice, max_slice)``: each event's SSE ``id`` is its offset,
so a client that reconnects with ``Last-Event-ID`` (or ``?offset=``) goes on exactly after the last event it
received. The feed ends when the server shuts down (:class:`Server`): a deploy's SIGTERM stops the service at
once instead of waiting for every SSE client to hang up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from pgjournal.aio import AsyncJournal
from pgjournal.entity import AsyncEntityRepository, CircuitOpen, CommandResult, DomainError
from pgjournal.errors import (
    ConcurrencyConflict,
    DatabaseUnavailable,
    EventNotFound,
    InvalidArgument,
    InvalidPersistenceId,
    JournalError,
    RetriesExhausted,
    WriteOutcomeUnknown,
)
from pgjournal.examples.shopping_cart import (
    MAX_QUANTITY,
    AddItem,
    AdjustQuantity,
    Cart,
    CheckOut,
    GetCart,
    RemoveItem,
    ShoppingCart,
)
from pgjournal.model.offsets import NoOffset, parse_offset
from pgjournal.model.printable import printable_logger
from pgjournal.model.slices import NUMBER_OF_SLICES
from pgjournal.server.dsn import mask_dsn

log = printable_logger(__name__)

#: Each typed error's answer, most specific first: the client's mistakes and conflicts are 4xx with the message
#: (it names the value and what was expected); everything else is the service's trouble, 503 with a fixed text,
#: since its message may quote the connection string (masked, but still the server's address and user).
ANSWERS: tuple[tuple[type[JournalError], int, str | None], ...] = (
    (InvalidPersistenceId, 400, None),
    (InvalidArgument, 400, None),
    (EventNotFound, 404, None),
    (ConcurrencyConflict, 409, None),
    (WriteOutcomeUnknown, 503, "the database connection was lost during the write: it may or may not have been "
                               "written; read the cart before retrying"),
    (RetriesExhausted, 503, "the database is busy; nothing was written, retry later"),
    (DatabaseUnavailable, 503, "the database is unavailable; retry later"),
    (JournalError, 503, "the journal failed; retry later"),
)


def answer(exc: JournalError) -> JSONResponse:
    """The HTTP answer to a typed error: 4xx naming the problem, or 503 that names no server."""
    status, text = next((status, text) for kind, status, text in ANSWERS if isinstance(exc, kind))
    if text is not None:
        log.warning("%s: %s", type(exc).__name__, mask_dsn(str(exc)))
        retry = str(max(1, round(exc.retry_after))) if isinstance(exc, CircuitOpen) else "1"
        return JSONResponse({"error": text, "kind": type(exc).__name__}, status_code=status,
                            headers={"Retry-After": retry})
    return JSONResponse({"error": mask_dsn(str(exc)), "kind": type(exc).__name__}, status_code=status)


class NewItem(BaseModel):
    item_id: str = Field(min_length=1, max_length=100)
    quantity: int = Field(ge=1, le=MAX_QUANTITY)


class Quantity(BaseModel):
    quantity: int = Field(ge=1, le=MAX_QUANTITY)


def cart_view(cart_id: str, result: CommandResult[Cart]) -> dict[str, Any]:
    return {"cart_id": cart_id, "items": result.state.items, "checked_out": result.state.checked_out,
            "seq_nr": result.seq_nr, "reply": result.reply if isinstance(result.reply, str) else None}


def sse(event: Any) -> str:
    """One server-sent event of an envelope: its offset as the id, the event's class as the type."""
    payload = {"persistence_id": event.persistence_id, "seq_nr": event.seq_nr,
               "db_timestamp": event.db_timestamp.isoformat(),
               "event": (dataclasses.asdict(event.event)
                         if dataclasses.is_dataclass(event.event) and not isinstance(event.event, type)
                         else event.event)}
    return f"id: {event.offset}\nevent: {type(event.event).__name__}\ndata: {json.dumps(payload)}\n\n"


T = TypeVar("T")


async def until_stopped(source: AsyncIterator[T], stopping: asyncio.Event) -> AsyncIterator[T]:
    """The items of ``source`` until ``stopping`` is set (the one being awaited then is cancelled)."""
    stop = asyncio.ensure_future(stopping.wait())
    try:
        while True:
            item = asyncio.ensure_future(anext(source))
            await asyncio.wait((item, stop), return_when=asyncio.FIRST_COMPLETED)
            if not item.done():
                item.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await item
                return
            try:
                yield item.result()
            except StopAsyncIteration:
                return
    finally:
        stop.cancel()


class Server(uvicorn.Server):
    """uvicorn's server, telling the app's streams to end before it waits for its connections to close (a
    graceful shutdown would otherwise wait for every SSE client to disconnect)."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.app = app

    async def shutdown(self, sockets: Any = None) -> None:
        stopping: asyncio.Event | None = getattr(self.app.state, "stopping", None)
        if stopping is not None:
            stopping.set()
        await super().shutdown(sockets)


def create_app(dsn: str | None = None, **settings: Any) -> FastAPI:
    """The service on the database at ``dsn`` (default: ``PGJOURNAL_DSN``, else the embedded server)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncJournal.open(dsn, **settings) as journal:
            app.state.journal = journal
            app.state.stopping = asyncio.Event()  # set by Server.shutdown: the SSE streams end
            app.state.carts = AsyncEntityRepository(journal, ShoppingCart)
            yield

    app = FastAPI(title="pgjournal shopping carts", lifespan=lifespan)

    @app.exception_handler(DomainError)
    async def refused(_request: Request, exc: DomainError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=409)

    @app.exception_handler(RequestValidationError)
    async def bad_body(_request: Request, exc: RequestValidationError) -> Response:
        """FastAPI's own answer quotes the input back and fails (a 500) on text it cannot encode; this one
        names each field and rule, ASCII-escaped, without the input."""
        detail = [{"loc": list(error.get("loc", ())), "msg": str(error.get("msg", "")), "type": error.get("type")}
                  for error in exc.errors()]
        text = "; ".join(f"{'.'.join(map(str, d['loc']))}: {d['msg']}" for d in detail)
        return Response(json.dumps({"error": text, "detail": detail}), status_code=422,
                        media_type="application/json")

    @app.exception_handler(JournalError)
    async def journal_error(_request: Request, exc: JournalError) -> JSONResponse:
        return answer(exc)

    async def command(request: Request, cart_id: str, cmd: Any) -> dict[str, Any]:
        carts: AsyncEntityRepository[Cart] = request.app.state.carts
        return cart_view(cart_id, await carts.handle(cart_id, cmd))

    @app.get("/carts/{cart_id}")
    async def get_cart(request: Request, cart_id: str) -> dict[str, Any]:
        return await command(request, cart_id, GetCart())

    @app.post("/carts/{cart_id}/items", status_code=201)
    async def add_item(request: Request, cart_id: str, item: NewItem) -> dict[str, Any]:
        return await command(request, cart_id, AddItem(item.item_id, item.quantity))

    @app.put("/carts/{cart_id}/items/{item_id}")
    async def adjust(request: Request, cart_id: str, item_id: str, body: Quantity) -> dict[str, Any]:
        return await command(request, cart_id, AdjustQuantity(item_id, body.quantity))

    @app.delete("/carts/{cart_id}/items/{item_id}")
    async def remove(request: Request, cart_id: str, item_id: str) -> dict[str, Any]:
        return await command(request, cart_id, RemoveItem(item_id))

    @app.post("/carts/{cart_id}/checkout")
    async def checkout(request: Request, cart_id: str) -> dict[str, Any]:
        return await command(request, cart_id, CheckOut())

    @app.get("/events")
    async def events(request: Request, min_slice: int = 0, max_slice: int = NUMBER_OF_SLICES - 1,
                     offset: str | None = None,
                     last_event_id: str | None = Header(default=None)) -> StreamingResponse:
        """Cart events of the slice range, live (server-sent events), after ``offset`` / ``Last-Event-ID``."""
        journal: AsyncJournal = request.app.state.journal
        start = last_event_id or offset
        live = journal.query.events_by_slices(ShoppingCart.name, min_slice, max_slice,
                                              parse_offset(start) if start else NoOffset)

        async def stream() -> AsyncIterator[str]:
            async with live:  # closed when the client goes away (the response task is cancelled)
                yield ": connected\n\n"
                async for envelope in until_stopped(aiter(live), request.app.state.stopping):
                    yield sse(envelope)

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The shopping cart over HTTP, with a live SSE feed of events.")
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: PGJOURNAL_DSN, else the embedded server)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    app = create_app(args.dsn)
    Server(uvicorn.Config(app, host=args.host, port=args.port), app).run()


if __name__ == "__main__":
    main()
