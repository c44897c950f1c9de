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
    data  bytea NOT NULL,
    CONSTRAINT idem_results_pkey PRIMARY KEY (day, scope, id)
) PARTITION BY RANGE (day);
