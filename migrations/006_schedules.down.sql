DROP TABLE idem_schedules;
DROP INDEX idem_runs_attributes;
ALTER TABLE idem_runs DROP COLUMN attributes;
