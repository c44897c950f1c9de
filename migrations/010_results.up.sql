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

-- A large result, read by the statement that looks its key up: from the one partition named part
-- (idem_results_pYYYYMMDD, as to_regclass reads it), or NULL when that partition is gone. A join
-- against idem_results instead would cost every lookup, small results included, a plan over and
-- a lock on each partition; a second statement would cost a large replay a round trip.
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
