-- idem's complete schema, generated from migrations/ (do not edit; see migrate.go): the
-- version table, each migration in order, and the rows that record them. Apply it once with any
-- migration tool; idem.Migrate then finds the database current and applies only later
-- migrations. Names are unqualified: the tables land in the first schema of search_path.

CREATE TABLE IF NOT EXISTS idem_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- 001_tables

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

-- 002_waits

-- Waiting runs (sleep, await a signal), run deadlines, signals and events.

-- A waiting run is in state 'sleeping' or 'awaiting' and holds no lease: its wake-up is a River
-- job, scheduled at wake_at (or at the deadline, whichever comes first), or inserted with the
-- signal that ends the wait. wait_seq is the position of the step that waits, and wait_name the
-- signal an awaiting run waits for; they stay after the wake-up, so that an await resumed after
-- a crash keeps the timeout it started with. deadline is when the run times out, if it has one.
ALTER TABLE idem_runs
    ADD COLUMN wait_seq  integer,
    ADD COLUMN wait_name text,
    ADD COLUMN wake_at   timestamptz,
    ADD COLUMN deadline  timestamptz;

-- Waiting runs by when they are due (wake-up or deadline, whichever comes first), for operators
-- and for the recovery scan, which wakes runs whose wake-up job is overdue.
CREATE INDEX idem_runs_wake ON idem_runs ((least(wake_at, deadline))) WHERE state IN ('sleeping', 'awaiting');

-- A run's mailbox: signals sent to it, kept until an await consumes them, each once, in the
-- order they were sent (seq). dedupe_id makes a signal delivered twice (a webhook retried by its
-- sender) one signal. Deleted with their run.
CREATE TABLE idem_signals (
    scope         text COLLATE "C" NOT NULL,
    id            text COLLATE "C" NOT NULL,
    seq           bigserial,
    name          text NOT NULL,
    payload       bytea,
    dedupe_id     text COLLATE "C",
    sent_at       timestamptz NOT NULL DEFAULT now(),
    -- Set when an await consumed the signal, in the transaction of that step's checkpoint.
    consumed_at   timestamptz,
    consumed_step integer,
    CONSTRAINT idem_signals_pkey PRIMARY KEY (scope, id, seq)
);

-- An await takes the oldest pending signal of its name.
CREATE INDEX idem_signals_pending ON idem_signals (scope, id, name, seq) WHERE consumed_at IS NULL;
CREATE UNIQUE INDEX idem_signals_dedupe ON idem_signals (scope, id, dedupe_id) WHERE dedupe_id IS NOT NULL;

-- Values a run publishes (steps.SetEvent), the last write per name. Deleted with their run.
CREATE TABLE idem_events (
    scope      text COLLATE "C" NOT NULL,
    id         text COLLATE "C" NOT NULL,
    name       text NOT NULL,
    value      bytea,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT idem_events_pkey PRIMARY KEY (scope, id, name)
);

-- 003_attempts

-- Every attempt visible: a step's failed attempts, kept beside its history so that an operator
-- can tell why a step ran three times. Written by the run's owner when an attempt fails (and, as
-- far as it can, when the run stops during one), trimmed to the newest few of each step, and
-- deleted with their run. The happy path writes nothing here.
CREATE TABLE idem_step_attempts (
    scope   text COLLATE "C" NOT NULL,
    id      text COLLATE "C" NOT NULL,
    n       bigint GENERATED ALWAYS AS IDENTITY,
    -- The step's position, name and kind: an attempt may be of a step that never completed, so
    -- that idem_steps has no row to name it.
    seq     integer NOT NULL,
    name    text NOT NULL,
    kind    text NOT NULL,
    -- The attempt's number within the process that ran it, from 1.
    attempt integer NOT NULL,
    -- retried, failed (the step failed for good after it), permanent, or stopped (the run stopped
    -- during it and will run the step again).
    outcome text NOT NULL,
    -- The attempt's error, clipped.
    error   text NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- By step, so that trimming finds the newest attempts of one step in the key's order.
    CONSTRAINT idem_step_attempts_pkey PRIMARY KEY (scope, id, seq, n)
);

-- 004_children

-- Child workflows: a run started by a step of another run (its parent) knows its parent, so that
-- its end can wake a parent that waits for it, a parent's cancel can reach it, and operators can
-- list a run's children. parent_seq is the step of the parent that started it; parent_close says
-- what a parent's cancel (or timeout) does to it while it is unfinished: 'cancel' it too, or
-- 'abandon' it (it goes on by itself).
ALTER TABLE idem_runs
    ADD COLUMN parent_scope text COLLATE "C",
    ADD COLUMN parent_id    text COLLATE "C",
    ADD COLUMN parent_seq   integer,
    ADD COLUMN parent_close text;

-- A run's children, for RunGet, RunList's parent filter and the cascade of a cancel.
CREATE INDEX idem_runs_parent ON idem_runs (parent_scope, parent_id) WHERE parent_id IS NOT NULL;

-- 005_concurrency

-- Per-key concurrency: a workflow may allow at most concurrency_limit runs with the same
-- concurrency_key to be active (running, sleeping or awaiting) at once. A run that finds its key
-- full waits in state 'queued', holding nothing, and is started, oldest first, by the
-- transaction that ends an active run of its key.
ALTER TABLE idem_runs
    ADD COLUMN concurrency_key   text COLLATE "C",
    ADD COLUMN concurrency_limit integer;

-- The active and queued runs of a key, oldest first: counted and promoted under the key's lock.
CREATE INDEX idem_runs_concurrency ON idem_runs (workflow, concurrency_key, created_at)
    WHERE concurrency_key IS NOT NULL AND state IN ('queued', 'running', 'sleeping', 'awaiting');

-- 006_schedules

-- Run attributes and durable schedules.

-- A run's attributes: string keys and values given when it starts and set by its steps, for
-- operators to find runs by (RunList, idem runs list --attr k=v). NULL for a run without any, so
-- that the GIN index, partial on NOT NULL, costs nothing to the runs that have none: a filter
-- `attributes @> '{"k":"v"}'` implies attributes IS NOT NULL, so the planner may use it.
-- jsonb_path_ops: containment is the only question asked, and its index is the smaller.
ALTER TABLE idem_runs ADD COLUMN attributes jsonb;
CREATE INDEX idem_runs_attributes ON idem_runs USING gin (attributes jsonb_path_ops) WHERE attributes IS NOT NULL;

-- A schedule starts a run of its workflow at each tick of a cron expression (in time_zone) or of
-- an interval (every_us, ticks at whole multiples of it since the Unix epoch), under the key
-- (scope, 'sched/<name>/<tick>'), in the transaction that moves next_tick on: a tick and its run
-- commit together, and two engines never start a tick twice (the due schedule's row is taken
-- FOR UPDATE SKIP LOCKED, and the key is unique anyway).
CREATE TABLE idem_schedules (
    name          text COLLATE "C" NOT NULL,
    workflow      text NOT NULL,
    -- The scope of the keys of the runs it starts.
    scope         text COLLATE "C" NOT NULL,
    -- Exactly one of cron and every_us.
    cron          text,
    every_us      bigint,
    time_zone     text NOT NULL,
    -- The input of every run, as JSON, and the attributes they get.
    input         bytea NOT NULL,
    attributes    jsonb,
    -- The runs' concurrency key and limit (Workflow.WithConcurrency), computed from the input
    -- when the schedule is defined, so that any process fires it alike; NULL for none.
    concurrency_key   text,
    concurrency_limit integer,
    -- skip or allow: what a tick does while the run of the one before is unfinished.
    overlap       text NOT NULL,
    -- latest, all or skip: which ticks missed while no engine ran are started afterwards.
    catch_up      text NOT NULL,
    paused        boolean NOT NULL DEFAULT false,
    pause_note    text,
    -- The next tick to start; the ticks before it were started or skipped.
    next_tick     timestamptz NOT NULL,
    -- The latest tick a run was started for, and that run's key ID (in scope), whose state the
    -- overlap policy looks at.
    last_tick     timestamptz,
    last_run_id   text COLLATE "C",
    ticks_started bigint NOT NULL DEFAULT 0,
    ticks_skipped bigint NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT idem_schedules_pkey PRIMARY KEY (name)
);

-- The engines' scheduler: active schedules by their next tick.
CREATE INDEX idem_schedules_due ON idem_schedules (next_tick) WHERE NOT paused;

-- 007_versions

-- Code versions (workflow.Config.Version). A run records the version of the process that started
-- it (version), which Config.ResumeVersions and RunList's filter read, and the version of the
-- process that took it over or woke it last (attempt_version; NULL until one does: the start's),
-- written by the statements that take a run anyway: no statement more on a run's way. A failed
-- attempt of a step records the version it ran on. NULL for what was written before.
ALTER TABLE idem_runs
    ADD COLUMN version         text,
    ADD COLUMN attempt_version text;

ALTER TABLE idem_step_attempts ADD COLUMN version text;

-- Unfinished runs by the version that started them, newest first: which runs of an old version
-- are left (idem runs list --version V --state queued,running,sleeping,awaiting), before the code
-- they need is deployed away. Done runs, the bulk, are left out, as from idem_runs_state: a run
-- that finishes as done adds nothing here, and its start one entry.
CREATE INDEX idem_runs_version ON idem_runs (version, created_at) WHERE state <> 'done';

-- 008_outbox

-- The outbox (package outbox): messages appended in the writer's transaction and relayed to a
-- broker in per-key commit order by relays that own lanes of keys through fenced leases.

-- One row per message key: the last sequence number taken for the key. A writer takes the next
-- one with an upsert that locks the row until it commits, so a second writer of the key waits
-- there and takes the number after it: a key's numbers, and its messages' positions (taken after
-- the lock), follow commit order. The reaper deletes the row with the key's newest message.
CREATE TABLE idem_outbox_keys (
    key text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    CONSTRAINT idem_outbox_keys_pkey PRIMARY KEY (key)
);

-- Positions: insert order, which for one key is commit order (see idem_outbox_keys). Relays read
-- new messages past the position they have reached.
CREATE SEQUENCE idem_outbox_pos_seq AS bigint;

-- The messages. Written once by Append; the relay sets published_at (and, on failures,
-- attempts, last_error and status), none of them indexed, so that those updates are HOT and
-- touch no index.
CREATE TABLE idem_outbox (
    -- UUIDv7, made by the writer: the message's id at the broker and in consumers' inboxes.
    id           uuid NOT NULL,
    pos          bigint NOT NULL DEFAULT nextval('idem_outbox_pos_seq'),
    -- The writer's transaction, so that a relay can find the messages of a transaction that
    -- committed after the relay had read past their positions.
    xid          xid8 NOT NULL DEFAULT pg_current_xact_id(),
    topic        text NOT NULL,
    -- '' for a message without a key: unordered.
    key          text COLLATE "C" NOT NULL,
    -- The key's sequence number, from 1; NULL without a key.
    seq          bigint,
    -- 31 bits of a hash of the key (of the id without a key): lane = hash % lanes.
    hash         integer NOT NULL,
    payload      bytea NOT NULL,
    headers      jsonb,
    created_at   timestamptz NOT NULL DEFAULT statement_timestamp(),
    published_at timestamptz,
    -- Failed publish attempts so far, and the last one's error.
    attempts     integer NOT NULL DEFAULT 0,
    last_error   text,
    -- NULL while the relay works on it (or once published); stopped: it failed every attempt and
    -- holds its key; dead: it failed every attempt and was set aside (dead-lettered); skipped: an
    -- operator set it aside.
    status       text,
    CONSTRAINT idem_outbox_pkey PRIMARY KEY (id)
);

CREATE INDEX idem_outbox_pos ON idem_outbox (pos);
CREATE INDEX idem_outbox_xid ON idem_outbox (xid);
-- What an operator looks for: stopped, dead and skipped messages.
CREATE INDEX idem_outbox_status ON idem_outbox (status, pos) WHERE status IS NOT NULL;

-- The lanes: hash(key) mod the number of rows here. Each is owned by one relay at a time through a
-- lease with a fencing token, which every write of the relay's presents. floor is a position
-- below which every message of the lane is settled and none can still commit, where a new owner
-- starts reading; rewind asks the owner to read the lane again from there (an operator retried
-- or skipped a message).
CREATE TABLE idem_outbox_lanes (
    lane       integer NOT NULL,
    owner      text,
    token      uuid,
    expires_at timestamptz,
    floor      bigint NOT NULL DEFAULT 0,
    rewind     bigint,
    CONSTRAINT idem_outbox_lanes_pkey PRIMARY KEY (lane)
);

-- The relays alive, each renewing its row, so that each knows its share of the lanes.
CREATE TABLE idem_outbox_relays (
    owner      text NOT NULL,
    expires_at timestamptz NOT NULL,
    CONSTRAINT idem_outbox_relays_pkey PRIMARY KEY (owner)
);

-- 009_run_writes

-- Fewer writes per workflow run. Every UPDATE of a row that changes a column an index reads (in
-- its key or its predicate) writes an entry in every index of the table, and every entry is a
-- record in the write-ahead log; an UPDATE that changes none of them, and finds room on the
-- row's page, is a heap-only (HOT) update and writes no index entry at all.

-- The recovery scan and the next lease expiry read the running runs through idem_runs_state
-- (state = 'running') and sort the few there are by lease expiry. Without an index on
-- lease_expires_at, a lease renewal or a takeover changes no indexed column, so it is a HOT
-- update; before, each wrote an entry in every index of idem_runs, and each start one here.
DROP INDEX idem_runs_lease;

-- Unfinished runs of a version are found through idem_runs_state (their states) and filtered by
-- version: they are the few that the state index holds anyway, and each start wrote an entry here.
DROP INDEX idem_runs_version;

-- Room on each page for new versions of its rows, so that the updates above stay on their page.
-- It applies to pages filled from here on.
ALTER TABLE idem_runs SET (fillfactor = 80);

-- The reaper walks Do's keys by expiry; a run's key never expires ('infinity': its run's reaper
-- deletes it), so it needs no entry here, and a run's start writes none.
DROP INDEX idem_keys_expires_at;
CREATE INDEX idem_keys_expires_at ON idem_keys (expires_at) WHERE expires_at < 'infinity';

-- 010_results

-- Large results of Do dropped, not deleted (docs/design/payloads.md). A result over 1 KiB goes to
-- idem_results, in the partition of the UTC day on which its key expires, when that partition
-- exists; the key's row keeps result NULL and names the day in result_day. Once that day and one
-- more have passed, every key that could point into the partition has expired, and the reaper
-- drops it whole: no WAL per row, no TOAST to delete, nothing for vacuum. Smaller results stay in
-- idem_keys, as before. The partitions (idem_results_pYYYYMMDD) are made ahead by the reaper and
-- by Migrate; a result whose day has none stays inline.
ALTER TABLE idem_keys ADD COLUMN result_day date;

CREATE TABLE idem_results (
    -- The UTC day its key expires on: the partition key.
    day   date NOT NULL,
    scope text COLLATE "C" NOT NULL,
    id    text COLLATE "C" NOT NULL,
    -- The key row's created_at, written by the same statement: a key's result is the row whose
    -- created_at is its key's. A key deleted by the reaper or expired and taken again may leave
    -- an older row of the same day behind; it goes with its partition. Part of the primary key
    -- so that a new row never collides with an old one: an INSERT with ON CONFLICT would cost
    -- every large result a speculative insertion (about a third more server time, measured).
    created_at timestamptz NOT NULL,
    data  bytea NOT NULL,
    CONSTRAINT idem_results_pkey PRIMARY KEY (day, scope, id, created_at)
) PARTITION BY RANGE (day);

-- The partitions are named by day, and reached through these functions by name, never through
-- idem_results itself: a statement that names the partitioned table plans and locks every
-- partition, and one that inserts through it routes rows with the partitions it knew when it
-- started, so that a partition attached meanwhile would make its insert fail.

-- Stores a large result in the partition named part (idem_results_pYYYYMMDD, as to_regclass reads
-- it), and says whether it could: false when that partition does not exist (yet), and the result
-- then stays in its key's row. A partition is made and attached in one transaction, so one that
-- to_regclass finds is attached.
CREATE FUNCTION idem_result_put(part text, day date, scope text, id text, created timestamptz, data bytea) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    rel regclass := to_regclass(part);
BEGIN
    IF rel IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('INSERT INTO %s (day, scope, id, created_at, data) VALUES ($1, $2, $3, $4, $5)', rel)
        USING day, scope, id, created, data;
    RETURN true;
END
$$;

-- A large result, read by the statement that looks its key up, from the partition named part, or
-- NULL when that partition is gone.
CREATE FUNCTION idem_result_data(part text, day date, scope text, id text, created timestamptz) RETURNS bytea
LANGUAGE plpgsql STABLE STRICT AS $$
DECLARE
    rel  regclass := to_regclass(part);
    data bytea;
BEGIN
    IF rel IS NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE format('SELECT data FROM %s WHERE day = $1 AND scope = $2 AND id = $3 AND created_at = $4', rel)
        INTO data USING day, scope, id, created;
    RETURN data;
END
$$;

-- The size of a large result, for the operator's listings, without reading it (octet_length of a
-- value stored out of line reads its header only).
CREATE FUNCTION idem_result_size(part text, day date, scope text, id text, created timestamptz) RETURNS integer
LANGUAGE plpgsql STABLE STRICT AS $$
DECLARE
    rel  regclass := to_regclass(part);
    size integer;
BEGIN
    IF rel IS NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE format('SELECT octet_length(data) FROM %s WHERE day = $1 AND scope = $2 AND id = $3 AND created_at = $4', rel)
        INTO size USING day, scope, id, created;
    RETURN size;
END
$$;

-- 011_outbox_payloads

-- Large outbox message bodies dropped, not deleted (docs/design/payloads.md). A body over 1 KiB
-- goes to idem_outbox_payloads, in the partition of the UTC day its message was appended on
-- (the day of its created_at), when that partition exists; the message's row keeps payload NULL
-- and names the day in payload_day. The reaper drops a day's partition whole once no message of
-- that day is left in idem_outbox (published and skipped messages go after the retention; a
-- stopped or dead-lettered one keeps its day's partition until an operator acts). Smaller
-- bodies, and headers, stay in idem_outbox, as before. The partitions
-- (idem_outbox_payloads_pYYYYMMDD) are made ahead by the reaper and by Migrate; a body whose day
-- has none stays inline.
ALTER TABLE idem_outbox ALTER COLUMN payload DROP NOT NULL;
ALTER TABLE idem_outbox ADD COLUMN payload_day date;

-- The reaper's question before it drops a day's partition: is a message of that day left? Only
-- messages with a large body have an entry; the relay's updates do not touch the column, so
-- they stay HOT.
CREATE INDEX idem_outbox_payload_day ON idem_outbox (payload_day) WHERE payload_day IS NOT NULL;

CREATE TABLE idem_outbox_payloads (
    -- The UTC day the message was appended on: the partition key.
    day  date NOT NULL,
    id   uuid NOT NULL,
    data bytea NOT NULL,
    CONSTRAINT idem_outbox_payloads_pkey PRIMARY KEY (day, id)
) PARTITION BY RANGE (day);

-- Stores large bodies in the partition named part (idem_outbox_payloads_pYYYYMMDD, as to_regclass
-- reads it), and says whether it could: false when that partition does not exist (yet), and the
-- bodies then stay in their rows. By name, never through idem_outbox_payloads: an INSERT through
-- the partitioned table routes rows with the partitions it knew when it started, and would fail
-- if the day's partition was attached meanwhile. A partition is made and attached in one
-- transaction, so one that to_regclass finds is attached.
CREATE FUNCTION idem_outbox_payloads_put(part text, day date, ids uuid[], data bytea[]) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    rel regclass := to_regclass(part);
BEGIN
    IF rel IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('INSERT INTO %s (day, id, data) SELECT $1, u.id, u.data FROM unnest($2, $3) AS u(id, data)', rel)
        USING day, ids, data;
    RETURN true;
END
$$;

-- The same for one body (no arrays to build and take apart).
CREATE FUNCTION idem_outbox_payload_put(part text, day date, id uuid, data bytea) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    rel regclass := to_regclass(part);
BEGIN
    IF rel IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('INSERT INTO %s (day, id, data) VALUES ($1, $2, $3)', rel) USING day, id, data;
    RETURN true;
END
$$;

-- 012_run_payloads

-- Large payloads of workflow runs dropped, not deleted (docs/design/payloads.md): a step's output
-- (idem_steps.output), a signal's payload (idem_signals.payload) and an event's value
-- (idem_events.value) over 1 KiB go to idem_run_payloads, in the partition of the UTC day on
-- which their run started (idem_runs.created_at), when that partition exists. A run's expiry is
-- unknown while it runs (it may sleep for months), but its start is fixed: the partition of day D
-- holds only payloads of runs created on D, and is dropped once D is two days past and no run
-- created on D is left in idem_runs. A long run pins its own start day only. The owner's row
-- keeps the payload column NULL and names the day in output_day, payload_day or value_day.
-- Smaller payloads stay in the owner's row, as before; so do a run's input and output
-- (idem_runs), which are read with the run's row.
ALTER TABLE idem_steps ADD COLUMN output_day date;
ALTER TABLE idem_signals ADD COLUMN payload_day date;
ALTER TABLE idem_events ADD COLUMN value_day date;

CREATE TABLE idem_run_payloads (
    -- The UTC day its run was created on: the partition key.
    day   date NOT NULL,
    scope text COLLATE "C" NOT NULL,
    id    text COLLATE "C" NOT NULL,
    -- Whose payload: 's' a step's output (ref: its seq), 'g' a signal's payload (ref: its seq),
    -- 'e' an event's value (ref: its name).
    kind  "char" NOT NULL,
    ref   text COLLATE "C" NOT NULL,
    data  bytea NOT NULL,
    CONSTRAINT idem_run_payloads_pkey PRIMARY KEY (day, scope, id, kind, ref)
) PARTITION BY RANGE (day);

-- Stores a payload in the partition named part (idem_run_payloads_pYYYYMMDD, as to_regclass reads
-- it), by name: an INSERT through idem_run_payloads would route rows with the partitions it knew
-- when its statement started, and fail if the one for its day was attached meanwhile. upsert
-- overwrites a row left under the same ref (a step cut and run again, an event written again).
-- False when the partition does not exist.
CREATE FUNCTION idem_run_payload_put(part text, day date, scope text, id text, kind text, ref text, data bytea, upsert boolean)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    rel regclass := to_regclass(part);
    sql text;
BEGIN
    IF rel IS NULL THEN
        RETURN false;
    END IF;
    sql := format('INSERT INTO %s (day, scope, id, kind, ref, data) VALUES ($1, $2, $3, $4::"char", $5, $6)', rel);
    IF upsert THEN
        sql := sql || ' ON CONFLICT (day, scope, id, kind, ref) DO UPDATE SET data = excluded.data';
    END IF;
    EXECUTE sql USING day, scope, id, kind, ref, data;
    RETURN true;
END
$$;

-- 013_forks

-- Where a forked run came from (workflow.Engine.RunFork): the run it copied and how many of that
-- run's steps it copied, for operators (idem runs show, idemui), so that a copied step is told
-- from the run's own by its position, not guessed from its time. NULL for every other run, which
-- costs a row nothing but its null bitmap's bits.
ALTER TABLE idem_runs
    ADD COLUMN forked_scope text COLLATE "C",
    ADD COLUMN forked_id    text COLLATE "C",
    ADD COLUMN forked_steps integer;

INSERT INTO idem_migrations (version, name) VALUES (1, 'tables');
INSERT INTO idem_migrations (version, name) VALUES (2, 'waits');
INSERT INTO idem_migrations (version, name) VALUES (3, 'attempts');
INSERT INTO idem_migrations (version, name) VALUES (4, 'children');
INSERT INTO idem_migrations (version, name) VALUES (5, 'concurrency');
INSERT INTO idem_migrations (version, name) VALUES (6, 'schedules');
INSERT INTO idem_migrations (version, name) VALUES (7, 'versions');
INSERT INTO idem_migrations (version, name) VALUES (8, 'outbox');
INSERT INTO idem_migrations (version, name) VALUES (9, 'run_writes');
INSERT INTO idem_migrations (version, name) VALUES (10, 'results');
INSERT INTO idem_migrations (version, name) VALUES (11, 'outbox_payloads');
INSERT INTO idem_migrations (version, name) VALUES (12, 'run_payloads');
INSERT INTO idem_migrations (version, name) VALUES (13, 'forks');
