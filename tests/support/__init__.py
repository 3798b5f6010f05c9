"""What the tests share besides fixtures (fixtures are in tests/conftest.py, which imports from here).

``from support import FAST, Roles, ...`` gives the suite's settings, sessions and roles; helpers with a concern of
their own are modules of this package (``support.eventually``, ``support.faultproxy``, ``support.aio``, ...).
``tests/`` is the import root (``pythonpath`` in pyproject.toml), so ``support`` imports the same from every test
folder and from the worker processes the tests start with ``tests/`` on their ``PYTHONPATH``.
"""

from support.database import database_dsn, make_serializable, waits_on_a_lock
from support.roles import ROLE_PASSWORD, SECRET, Roles, create_login_role, role_dsn
from support.settings import FAST, PORTABLE, PORTABLE_ENV

__all__ = [
    "FAST",
    "PORTABLE",
    "PORTABLE_ENV",
    "ROLE_PASSWORD",
    "SECRET",
    "Roles",
    "create_login_role",
    "database_dsn",
    "make_serializable",
    "role_dsn",
    "waits_on_a_lock",
]
