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
