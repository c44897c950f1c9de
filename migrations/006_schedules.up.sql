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
