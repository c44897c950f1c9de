-- Every payload that is still referenced goes back into its owner's row first: nothing is lost.
-- The locks come first, so that no payload can be stored between the move and the drop.
LOCK TABLE idem_steps, idem_signals, idem_events, idem_run_payloads IN ACCESS EXCLUSIVE MODE;
UPDATE idem_steps s SET output = p.data, output_day = NULL
FROM idem_run_payloads p
WHERE p.day = s.output_day AND p.scope = s.scope AND p.id = s.id AND p.kind = 's' AND p.ref = s.seq::text;
UPDATE idem_signals g SET payload = p.data, payload_day = NULL
FROM idem_run_payloads p
WHERE p.day = g.payload_day AND p.scope = g.scope AND p.id = g.id AND p.kind = 'g' AND p.ref = g.seq::text;
UPDATE idem_events e SET value = p.data, value_day = NULL
FROM idem_run_payloads p
WHERE p.day = e.value_day AND p.scope = e.scope AND p.id = e.id AND p.kind = 'e' AND p.ref = e.name;
ALTER TABLE idem_steps DROP COLUMN output_day;
ALTER TABLE idem_signals DROP COLUMN payload_day;
ALTER TABLE idem_events DROP COLUMN value_day;
DROP TABLE idem_run_payloads;
DROP FUNCTION idem_run_payload_put(text, date, text, text, text, text, bytea, boolean);
-- Partitions detached by a drop that did not finish.
DO $$
DECLARE n text;
BEGIN
    FOR n IN SELECT quote_ident(relname) FROM pg_class
        WHERE relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) AND relkind = 'r' AND relname ~ '^idem_run_payloads_p[0-9]{8}$'
    LOOP
        EXECUTE 'DROP TABLE ' || n;
    END LOOP;
END
$$;
