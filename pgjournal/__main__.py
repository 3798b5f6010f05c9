"""``python -m pgjournal`` is the ``pgjournal`` command."""

from pgjournal.cli.commands import main

main()
