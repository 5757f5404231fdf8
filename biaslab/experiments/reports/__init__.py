"""Reports: tables and figures written from a run store alone."""
