-- Child workflows: a run started by a step of another run (its parent) knows its parent, so that
-- its end can wake a parent that waits for it, a parent's cancel can reach it, and operators can
-- list a run's children. parent_seq is the step of the parent that started it; parent_close says
-- what a parent's cancel (or timeout) does to it while it is unfinished: 'cancel' it too, or
-- 'abandon' it (it goes on by itself).
ALTER TABLE idem_runs
    ADD COLUMN parent_scope text COLLATE "C",
    ADD COLUMN parent_id    text COLLATE "C",
    ADD COLUMN parent_seq   integer,
    ADD COLUMN parent_close text;

-- A run's children, for RunGet, RunList's parent filter and the cascade of a cancel.
CREATE INDEX idem_runs_parent ON idem_runs (parent_scope, parent_id) WHERE parent_id IS NOT NULL;
