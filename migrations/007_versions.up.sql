-- Code versions (workflow.Config.Version). A run records the version of the process that started
-- it (version), which Config.ResumeVersions and RunList's filter read, and the version of the
-- process that holds it now or held it last (attempt_version), written by the statements that
-- take a run anyway (its start, a takeover, a wake-up): no statement more on a run's way. A
-- failed attempt of a step records the version it ran on. NULL for what was written before.
ALTER TABLE idem_runs
    ADD COLUMN version         text,
    ADD COLUMN attempt_version text;

ALTER TABLE idem_step_attempts ADD COLUMN version text;

-- Runs by the version that started them, newest first: which runs of an old version are left
-- (idem runs list --version), before the code they need is deployed away.
CREATE INDEX idem_runs_version ON idem_runs (version, created_at);
