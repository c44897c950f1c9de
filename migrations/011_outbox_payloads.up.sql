-- Reserved for the outbox's large message bodies (idem_outbox_payloads), which land in their own
-- change; this file keeps the numbering contiguous until then.
SELECT 1;
