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
