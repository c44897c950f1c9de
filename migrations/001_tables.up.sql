-- idem's tables. Names are unqualified: they land in the first schema of search_path, which
-- idem.Migrate sets to the configured schema.

-- One row per key, written once and never changed: idem.Do's stored results, and the keys of
-- workflow runs (whose state lives in idem_runs), so that one key names one operation.
--
-- Do's hot path inserts here on every fresh key, so the table carries what Do needs and nothing
-- else: no CHECK constraint (each costs Postgres a parse and plan of its expression on every
-- INSERT; idem validates keys before any SQL), no column that changes while a run works, and
-- one index beside the primary key, the reaper's. Keys compare with COLLATE "C": byte order is
-- all a key needs, and it keeps index probes away from locale-aware comparison.
CREATE TABLE idem_keys (
    scope       text COLLATE "C" NOT NULL,
    id          text COLLATE "C" NOT NULL,
    -- The request's digest; a different one under the same key is refused.
    fingerprint bytea,
    -- Do's result as JSON. NULL for a run's key.
    result      bytea,
    -- Set when the key belongs to a run of this workflow (see idem_runs); NULL for idem.Do.
    workflow    text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- When Do's key may be reaped or used again. 'infinity' for a run's key: a run's expiry is
    -- idem_runs.expires_at, and the run's reaper deletes its key with it.
    expires_at  timestamptz NOT NULL,
    CONSTRAINT idem_keys_pkey PRIMARY KEY (scope, id)
);

-- The reaper walks expired keys in expiry order. A B-tree on a column that grows with time takes
-- its inserts at its right edge, which stays in cache.
CREATE INDEX idem_keys_expires_at ON idem_keys (expires_at);

-- One row per workflow run: what it runs, how far it got, who owns it now.
CREATE TABLE idem_runs (
    scope            text COLLATE "C" NOT NULL,
    id               text COLLATE "C" NOT NULL,
    workflow         text NOT NULL,
    -- running, done, failed or cancelled (see package workflow).
    state            text NOT NULL,
    fingerprint      bytea,
    input            bytea,
    -- done: the workflow's output as JSON; failed or cancelled: {"error": "..."}.
    output           bytea,
    -- Why the last attempt stopped without an outcome (non-determinism, a panic), for operators
    -- and the reconcile hook.
    last_error       text,
    -- How many times the run was started or taken over since its budget was last renewed.
    attempts         integer NOT NULL DEFAULT 0,
    -- The lease: a fencing token that every checkpoint must present, who holds it, and until
    -- when. A run whose lease expired is resumed elsewhere.
    lease_token      uuid,
    lease_owner      text,
    lease_expires_at timestamptz,
    -- W3C traceparent of the request that started the run, so that a resume links back to it.
    trace_context    text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    -- Set when the run finishes; until then the run is never reaped.
    expires_at       timestamptz,
    CONSTRAINT idem_runs_pkey PRIMARY KEY (scope, id)
);

-- The recovery scan: running runs by lease expiry.
CREATE INDEX idem_runs_lease ON idem_runs (lease_expires_at) WHERE state = 'running';
-- Operators list runs newest first, by state, by workflow; (scope, id) makes the order total, so
-- a cursor stays stable while runs are added.
CREATE INDEX idem_runs_created ON idem_runs (created_at, scope, id);
-- By state, for the runs an operator looks for (running, failed, cancelled); done runs, the
-- bulk, are found through idem_runs_created, and finishing a run as done adds nothing here.
CREATE INDEX idem_runs_state ON idem_runs (state, created_at) WHERE state <> 'done';
CREATE INDEX idem_runs_workflow ON idem_runs (workflow, created_at);
-- The reaper: finished runs by expiry.
CREATE INDEX idem_runs_expires_at ON idem_runs (expires_at) WHERE expires_at IS NOT NULL;

-- One row per completed step of a run: its history, replayed on resume. seq is the step's
-- position in the run (1, 2, ...); name and kind let a resume detect code that no longer calls
-- the same steps in the same order. output is the step's JSON result; error is set instead when
-- the step failed for good, so that the failure is replayed too.
--
-- No foreign key to idem_runs: its check would cost a lookup and a row lock on every checkpoint,
-- which the checkpoint's fence already does. Steps are deleted with their run by idem's own
-- statements (reaping, reusing an expired key).
CREATE TABLE idem_steps (
    scope      text COLLATE "C" NOT NULL,
    id         text COLLATE "C" NOT NULL,
    seq        integer NOT NULL,
    name       text NOT NULL,
    kind       text NOT NULL,
    output     bytea,
    error      text,
    attempts   integer NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT idem_steps_pkey PRIMARY KEY (scope, id, seq)
);
