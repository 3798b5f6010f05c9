"""``python tests/support/killed_move.py POINT ARGS...``: ``pgjournal ARGS...`` whose shard mover kills its own
process (SIGKILL, as ``kill -9`` would) the moment it reaches ``POINT`` (see ``Mover``'s ``reached``), so a test
builds the crash at each point of a move on purpose."""

from __future__ import annotations

import functools
import os
import signal
import sys

from pgjournal.shards import move


def killed_at(point: str) -> move.Reached:
    def reached(at: str) -> None:
        if at == point:
            os.kill(os.getpid(), signal.SIGKILL)

    return reached


if __name__ == "__main__":
    point, *args = sys.argv[1:]
    move.Mover.__init__ = functools.partialmethod(move.Mover.__init__, reached=killed_at(point))  # type: ignore[method-assign]
    from pgjournal.cli.commands import main

    sys.argv = ["pgjournal", *args]
    main()
