"""The store layer: SQL text, table names and row shapes, one module per concern. Everything above it (the
write path, queries, projections, Spark jobs) calls these instead of writing SQL of its own."""
