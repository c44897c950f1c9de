-- Reserved: see 011_outbox_payloads.up.sql.
SELECT 1;
