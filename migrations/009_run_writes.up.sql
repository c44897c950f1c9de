-- Fewer writes per workflow run. Every UPDATE of a row that changes a column an index reads (in
-- its key or its predicate) writes an entry in every index of the table, and every entry is a
-- record in the write-ahead log; an UPDATE that changes none of them, and finds room on the
-- row's page, is a heap-only (HOT) update and writes no index entry at all.

-- The recovery scan and the next lease expiry read the running runs through idem_runs_state
-- (state = 'running') and sort the few there are by lease expiry. Without an index on
-- lease_expires_at, a lease renewal or a takeover changes no indexed column, so it is a HOT
-- update; before, each wrote an entry in every index of idem_runs, and each start one here.
DROP INDEX idem_runs_lease;

-- Unfinished runs of a version are found through idem_runs_state (their states) and filtered by
-- version: they are the few that the state index holds anyway, and each start wrote an entry here.
DROP INDEX idem_runs_version;

-- Room on each page for new versions of its rows, so that the updates above stay on their page.
-- It applies to pages filled from here on.
ALTER TABLE idem_runs SET (fillfactor = 80);

-- The reaper walks Do's keys by expiry; a run's key never expires ('infinity': its run's reaper
-- deletes it), so it needs no entry here, and a run's start writes none.
DROP INDEX idem_keys_expires_at;
CREATE INDEX idem_keys_expires_at ON idem_keys (expires_at) WHERE expires_at < 'infinity';
