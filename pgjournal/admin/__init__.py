"""Schema management: migrations, the stored format, adopting Akka's tables, roles, verify."""
