"""The ``pgjournal`` command line: its commands, their shared helpers, ``make demo``."""


def main() -> None:
    from pgjournal.cli.commands import main as run

    run()
