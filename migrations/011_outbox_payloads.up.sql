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
