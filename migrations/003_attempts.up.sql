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
