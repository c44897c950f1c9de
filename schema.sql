-- idem schema. Every statement is idempotent, so this file can be applied again at any time, by
-- idem.Migrate or by any migration tool as is. Names are unqualified: the tables land in the first
-- schema of search_path (idem.Migrate sets it when a schema is configured).

-- One row per idempotency key. idem.Do writes finished rows (state 'done') and never leaves a
-- row behind for work that did not commit; workflows use the lease columns while they run.
--
-- Keys compare with COLLATE "C": byte order is all a key needs, and it keeps every index probe
-- away from locale-aware comparison. fillfactor leaves room on each page so that the updates a
-- workflow makes (checkpoints, lease renewals) can stay HOT and not touch the primary key.
CREATE TABLE IF NOT EXISTS idem_keys (
    scope          text COLLATE "C" NOT NULL,
    id             text COLLATE "C" NOT NULL,
    state          text NOT NULL DEFAULT 'done',
    fingerprint    bytea,
    result         bytea,
    workflow       text,
    input          bytea,
    recovery_point text,
    lease_token    uuid,
    locked_until   timestamptz,
    attempts       integer NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    CONSTRAINT idem_keys_pkey PRIMARY KEY (scope, id),
    CONSTRAINT idem_keys_state_check CHECK (state IN ('done', 'running', 'failed')),
    CONSTRAINT idem_keys_scope_length CHECK (octet_length(scope) BETWEEN 1 AND 255),
    CONSTRAINT idem_keys_id_length CHECK (octet_length(id) BETWEEN 1 AND 255)
) WITH (fillfactor = 90);

-- The reaper finds expired keys through this index. BRIN, because a B-tree here would be a
-- second index insert on every idem.Do: expiry grows with insertion order (one TTL for most keys),
-- so a block-range summary is nearly free to maintain and still narrows the reaper's scan.
CREATE INDEX IF NOT EXISTS idem_keys_expires_at ON idem_keys USING brin (expires_at)
    WITH (autosummarize = on);

-- ---------------------------------------------------------------------------------------------
-- Workflows (package workflow). Appended by the workflow package; idempotent like the rest.
-- ---------------------------------------------------------------------------------------------

-- Why a run is stuck, for the operator and the reconcile hook: set when a run stops for a reason
-- a retry will not fix by itself (non-determinism, a panic).
ALTER TABLE idem_keys ADD COLUMN IF NOT EXISTS last_error text;

-- The recovery scan looks only at running rows. A partial index on the key (not on locked_until)
-- keeps the lease renewals, which change locked_until and nothing indexed, eligible for HOT.
CREATE INDEX IF NOT EXISTS idem_keys_running ON idem_keys (scope, id) WHERE state = 'running';

-- One row per completed step of a workflow run: its history, replayed on resume. seq is the
-- step's position in the run (1, 2, ...); name and kind let a resume detect code that no longer
-- calls the same steps in the same order. output is the step's JSON result; error is set instead
-- when the step failed for good, so that the failure is replayed too. Rows go with their key.
CREATE TABLE IF NOT EXISTS idem_steps (
    scope      text COLLATE "C" NOT NULL,
    id         text COLLATE "C" NOT NULL,
    seq        integer NOT NULL,
    name       text NOT NULL,
    kind       text NOT NULL,
    output     bytea,
    error      text,
    attempts   integer NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT idem_steps_pkey PRIMARY KEY (scope, id, seq),
    CONSTRAINT idem_steps_key_fkey FOREIGN KEY (scope, id) REFERENCES idem_keys (scope, id) ON DELETE CASCADE
);
