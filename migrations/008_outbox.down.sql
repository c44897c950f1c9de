DROP TABLE idem_outbox_relays;
DROP TABLE idem_outbox_lanes;
DROP TABLE idem_outbox;
DROP SEQUENCE idem_outbox_pos_seq;
DROP TABLE idem_outbox_keys;
