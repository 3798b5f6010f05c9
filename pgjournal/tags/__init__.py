"""The tag view: its recorded writer, the in-statement writer, reconciliation."""
