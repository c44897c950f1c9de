DROP INDEX idem_runs_version;
ALTER TABLE idem_step_attempts DROP COLUMN version;
ALTER TABLE idem_runs
    DROP COLUMN attempt_version,
    DROP COLUMN version;
