DROP TABLE idem_step_attempts;
