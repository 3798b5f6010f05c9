"""What both faces share once a journal is open: the journal core, capabilities, the horizon."""
