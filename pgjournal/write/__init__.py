"""Appends: the event writer, appends as steps, transactions, the batched tag writer, what a failed write means."""
