DROP INDEX idem_keys_expires_at;
CREATE INDEX idem_keys_expires_at ON idem_keys (expires_at);
ALTER TABLE idem_runs RESET (fillfactor);
CREATE INDEX idem_runs_version ON idem_runs (version, created_at) WHERE state <> 'done';
CREATE INDEX idem_runs_lease ON idem_runs (lease_expires_at) WHERE state = 'running';
