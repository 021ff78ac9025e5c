"""Crash safety of every writer: locks (lock), the undo log and journal (undolog,
journal, staging), the committed write (commit), the run record (runrecord, runsfile)
and the shuffle mode's transaction across node-local directories (shufflejournal,
shufflecommit). Imports formats and scan."""
