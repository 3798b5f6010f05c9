"""``python -m pgjournal`` is the ``pgjournal`` command."""

from .cli import main

main()
