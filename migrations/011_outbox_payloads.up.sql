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
