-- Code versions (workflow.Config.Version). A run records the version of the process that started
-- it (version), which Config.ResumeVersions and RunList's filter read, and the version of the
-- process that took it over or woke it last (attempt_version; NULL until one does: the start's),
-- written by the statements that take a run anyway: no statement more on a run's way. A failed
-- attempt of a step records the version it ran on. NULL for what was written before.
ALTER TABLE idem_runs
    ADD COLUMN version         text,
    ADD COLUMN attempt_version text;

ALTER TABLE idem_step_attempts ADD COLUMN version text;

-- Unfinished runs by the version that started them, newest first: which runs of an old version
-- are left (idem runs list --version V --state queued,running,sleeping,awaiting), before the code
-- they need is deployed away. Done runs, the bulk, are left out, as from idem_runs_state: a run
-- that finishes as done adds nothing here, and its start one entry.
CREATE INDEX idem_runs_version ON idem_runs (version, created_at) WHERE state <> 'done';
