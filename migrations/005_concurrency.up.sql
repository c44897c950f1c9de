-- Per-key concurrency: a workflow may allow at most concurrency_limit runs with the same
-- concurrency_key to be active (running, sleeping or awaiting) at once. A run that finds its key
-- full waits in state 'queued', holding nothing, and is started, oldest first, by the
-- transaction that ends an active run of its key.
ALTER TABLE idem_runs
    ADD COLUMN concurrency_key   text COLLATE "C",
    ADD COLUMN concurrency_limit integer;

-- The active and queued runs of a key, oldest first: counted and promoted under the key's lock.
CREATE INDEX idem_runs_concurrency ON idem_runs (workflow, concurrency_key, created_at)
    WHERE concurrency_key IS NOT NULL AND state IN ('queued', 'running', 'sleeping', 'awaiting');
