"""The values readers and writers exchange: slices, TimeUUIDs, offsets, envelopes, printable names."""
