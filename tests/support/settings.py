"""The suite's journal settings and its mode (default or portable)."""

from __future__ import annotations

import os

#: ``PGJOURNAL_TEST_PORTABLE=1``: the ``journal`` fixture is portable (the Yugabyte/Cockroach path: no
#: notifications, no visibility horizon) and every test database defaults to SERIALIZABLE transactions, as
#: CockroachDB does, so serialization failures (40001) happen and their retry paths run.
PORTABLE_ENV = "PGJOURNAL_TEST_PORTABLE"
PORTABLE = os.environ.get(PORTABLE_ENV) == "1"
# Short polls keep live tests quick; semantics do not depend on them.
FAST = {"refresh_interval": 0.2, "behind_current_time": 0.05, "backtracking_behind_current_time": 1.0}
