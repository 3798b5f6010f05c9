"""The reviewed DDL per dialect (``pgjournal migrate --sql --dialect ...``) is kept in ``tests/dialects/golden/``: a
change to the schema or a dialect shows up as a diff to review. After a deliberate change, regenerate with
``PGJOURNAL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/dialects/test_ddl_golden.py`` and commit the files."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pgjournal.admin.migrate import upgrade_sql
from pgjournal.cli.commands import app
from pgjournal.dialects import DIALECTS

pytestmark = pytest.mark.mode_independent

GOLDEN = Path(__file__).parent / "golden"
UPDATE_ENV = "PGJOURNAL_UPDATE_GOLDEN"


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_ddl_matches_the_golden_file(dialect: str) -> None:
    path = GOLDEN / f"ddl_{dialect}.sql"
    sql = upgrade_sql(dialect)
    if os.environ.get(UPDATE_ENV) == "1":
        path.write_text(sql)
    assert path.exists(), f"{path} is missing: run with {UPDATE_ENV}=1 to create it"
    assert sql == path.read_text(), f"the {dialect} DDL changed: review the diff, then run with {UPDATE_ENV}=1"


@pytest.mark.parametrize("dialect", ["yugabyte", "cockroach"])
def test_cli_prints_the_golden_ddl(dialect: str) -> None:
    result = CliRunner().invoke(app, ["migrate", "--sql", "--dialect", dialect])
    assert result.exit_code == 0, result.output
    assert result.output == (GOLDEN / f"ddl_{dialect}.sql").read_text()


def test_yugabyte_ranges_on_slice_like_akka() -> None:
    sql = upgrade_sql("yugabyte")
    splits = "SPLIT AT VALUES ((127), (255), (383), (511), (639), (767), (895))"
    assert re.search(r"CREATE INDEX event_journal_slice_idx ON event_journal \(slice ASC, entity_type ASC, "
                     r"db_timestamp ASC, seq_nr ASC, persistence_id ASC, deleted ASC\) " + re.escape(splits), sql)
    offsets = sql.split("CREATE TABLE projection_timestamp_offset_store")[1].split(";")[0]
    assert "PRIMARY KEY (slice ASC, projection_name ASC, timestamp_offset ASC, persistence_id ASC, seq_nr ASC)" \
        in offsets and offsets.rstrip().endswith(splits)
    assert "PRIMARY KEY (persistence_id HASH, seq_nr ASC)" in sql and "PRIMARY KEY (persistence_id HASH)" in sql
    assert f"CREATE INDEX snapshot_slice_idx ON snapshot (slice ASC, entity_type ASC, db_timestamp ASC, " \
           f"persistence_id ASC) {splits}" in sql


def test_cockroach_indexes_the_page_order() -> None:
    sql = upgrade_sql("cockroach")
    assert ("CREATE INDEX event_journal_slice_idx ON event_journal (entity_type, db_timestamp, seq_nr, slice) "
            "USING HASH WITH (bucket_count = 16) STORING (deleted)") in sql
    assert "PRIMARY KEY (slice, projection_name, timestamp_offset, persistence_id, seq_nr)" in sql
