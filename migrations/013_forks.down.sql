ALTER TABLE idem_runs
    DROP COLUMN forked_scope,
    DROP COLUMN forked_id,
    DROP COLUMN forked_steps;
