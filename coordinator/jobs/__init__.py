"""Jobs as stored: specs and work, records, drivers, listings and lifecycle."""
