"""The suite's xdist groups are in effect (tests/conftest.py): under ``--dist loadgroup`` a worker gives each
grouped test a node id that ends in ``@`` and its group, and the scheduler sends a group to one worker."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.one_worker, pytest.mark.mode_independent]


def test_a_test_of_a_one_worker_module_carries_its_module_group(request: pytest.FixtureRequest) -> None:
    if not request.config.getvalue("loadgroup"):
        pytest.skip("not an xdist worker under --dist loadgroup")
    assert request.node.nodeid.endswith("@module-tests/test_groups.py"), request.node.nodeid
