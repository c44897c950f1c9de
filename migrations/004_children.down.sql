DROP INDEX idem_runs_parent;
ALTER TABLE idem_runs
    DROP COLUMN parent_close,
    DROP COLUMN parent_seq,
    DROP COLUMN parent_id,
    DROP COLUMN parent_scope;
