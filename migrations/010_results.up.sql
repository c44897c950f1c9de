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
