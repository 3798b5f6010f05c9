"""Where the database is and how pgjournal connects: DSNs, the embedded server, connections."""
