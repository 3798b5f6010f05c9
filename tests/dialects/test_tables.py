"""Which table a dialect names for a slice's events: one persistence id's statements (``event_table``) and a
statement over several persistence ids (``batch_table``, the replicator's batch), in pgjournal's layout and in an
adopted Akka journal's."""

from __future__ import annotations

import pytest

from pgjournal.dialects import DIALECTS

pytestmark = pytest.mark.mode_independent


def test_postgres_names_the_partition_for_one_pid_and_the_routing_table_for_a_batch() -> None:
    dialect = DIALECTS["postgres"]()
    assert dialect.event_table(1000) == "event_journal_s0896_1023"
    assert dialect.batch_table(1000) == dialect.batch_table(0) == "event_journal"


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_akka_data_partitions_are_tables_of_their_own_for_a_batch_too(dialect: str) -> None:
    # Akka's data partitions are separate tables under a view: nothing routes a row to them
    adopted = DIALECTS[dialect]()
    adopted.use_akka_layout(4)
    assert [adopted.batch_table(s) for s in (0, 255, 256, 1023)] == [
        "event_journal_0", "event_journal_0", "event_journal_1", "event_journal_3"]
    assert all(adopted.batch_table(s) == adopted.event_table(s) for s in range(0, 1024, 64))


@pytest.mark.parametrize("dialect", ["yugabyte", "cockroach"])
def test_an_unpartitioned_dialect_names_the_journal_for_both(dialect: str) -> None:
    assert DIALECTS[dialect]().event_table(7) == DIALECTS[dialect]().batch_table(7) == "event_journal"
