DROP INDEX idem_runs_concurrency;
ALTER TABLE idem_runs
    DROP COLUMN concurrency_limit,
    DROP COLUMN concurrency_key;
