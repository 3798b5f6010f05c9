"""The benchmark harness: ours beside the references, in the same run, on the same data."""
