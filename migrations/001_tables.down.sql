DROP TABLE idem_steps;
DROP TABLE idem_runs;
DROP TABLE idem_keys;
