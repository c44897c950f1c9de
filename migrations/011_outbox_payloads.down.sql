-- Every body that is still referenced goes back into its message's row first: nothing is lost.
-- A message whose body is missing would fail SET NOT NULL below, rather than lose it unnoticed.
-- The locks come first, so that no body can be stored between the move and the drop.
LOCK TABLE idem_outbox, idem_outbox_payloads IN ACCESS EXCLUSIVE MODE;
UPDATE idem_outbox o SET payload = p.data, payload_day = NULL
FROM idem_outbox_payloads p WHERE p.day = o.payload_day AND p.id = o.id;
DROP INDEX idem_outbox_payload_day;
ALTER TABLE idem_outbox DROP COLUMN payload_day;
ALTER TABLE idem_outbox ALTER COLUMN payload SET NOT NULL;
DROP TABLE idem_outbox_payloads;
DROP FUNCTION idem_outbox_payloads_put(text, date, uuid[], bytea[]);
DROP FUNCTION idem_outbox_payload_put(text, date, uuid, bytea);
-- Partitions detached by a drop that did not finish.
DO $$
DECLARE n text;
BEGIN
    FOR n IN SELECT quote_ident(relname) FROM pg_class
        WHERE relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) AND relkind = 'r' AND relname ~ '^idem_outbox_payloads_p[0-9]{8}$'
    LOOP
        EXECUTE 'DROP TABLE ' || n;
    END LOOP;
END
$$;
