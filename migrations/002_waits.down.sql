DROP TABLE idem_events;
DROP TABLE idem_signals;
DROP INDEX idem_runs_wake;
ALTER TABLE idem_runs
    DROP COLUMN deadline,
    DROP COLUMN wake_at,
    DROP COLUMN wait_name,
    DROP COLUMN wait_seq;
