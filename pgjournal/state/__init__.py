"""The latest state of a persistence id: durable state and snapshots."""
