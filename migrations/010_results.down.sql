-- Every result that is still referenced goes back into its key's row first: nothing is lost. The
-- locks come first, so that no Do can store a large result between the move and the drop.
LOCK TABLE idem_keys, idem_results IN ACCESS EXCLUSIVE MODE;
UPDATE idem_keys k SET result = r.data, result_day = NULL
FROM idem_results r WHERE r.day = k.result_day AND r.scope = k.scope AND r.id = k.id AND r.created_at = k.created_at;
ALTER TABLE idem_keys DROP COLUMN result_day;
DROP TABLE idem_results;
DROP FUNCTION idem_result_put(text, date, text, text, timestamptz, bytea);
DROP FUNCTION idem_result_data(text, date, text, text, timestamptz);
DROP FUNCTION idem_result_size(text, date, text, text, timestamptz);
-- Partitions detached by a drop that did not finish.
DO $$
DECLARE n text;
BEGIN
    FOR n IN SELECT quote_ident(relname) FROM pg_class
        WHERE relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) AND relkind = 'r' AND relname ~ '^idem_results_p[0-9]{8}$'
    LOOP
        EXECUTE 'DROP TABLE ' || n;
    END LOOP;
END
$$;
