"""Example entities built on :mod:`pgjournal.entity` (used by the demo and the README)."""
