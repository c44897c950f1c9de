-- The outbox (package outbox): messages appended in the writer's transaction and relayed to a
-- broker in per-key commit order by relays that own lanes of keys through fenced leases.

-- One row per message key: the last sequence number taken for the key. A writer takes the next
-- one with an upsert that locks the row until it commits, so a second writer of the key waits
-- there and takes the number after it: a key's numbers, and its messages' positions (taken after
-- the lock), follow commit order. The reaper deletes the row with the key's newest message.
CREATE TABLE idem_outbox_keys (
    key text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    CONSTRAINT idem_outbox_keys_pkey PRIMARY KEY (key)
);

-- Positions: insert order, which for one key is commit order (see idem_outbox_keys). Relays read
-- new messages past the position they have reached.
CREATE SEQUENCE idem_outbox_pos_seq AS bigint;

-- The messages. Written once by Append; the relay sets published_at (and, on failures,
-- attempts, last_error and status), none of them indexed, so that those updates are HOT and
-- touch no index.
CREATE TABLE idem_outbox (
    -- UUIDv7, made by the writer: the message's id at the broker and in consumers' inboxes.
    id           uuid NOT NULL,
    pos          bigint NOT NULL DEFAULT nextval('idem_outbox_pos_seq'),
    -- The writer's transaction, so that a relay can find the messages of a transaction that
    -- committed after the relay had read past their positions.
    xid          xid8 NOT NULL DEFAULT pg_current_xact_id(),
    topic        text NOT NULL,
    -- '' for a message without a key: unordered.
    key          text COLLATE "C" NOT NULL,
    -- The key's sequence number, from 1; NULL without a key.
    seq          bigint,
    -- 31 bits of a hash of the key (of the id without a key): lane = hash % lanes.
    hash         integer NOT NULL,
    payload      bytea NOT NULL,
    headers      jsonb,
    created_at   timestamptz NOT NULL DEFAULT statement_timestamp(),
    published_at timestamptz,
    -- Failed publish attempts so far, and the last one's error.
    attempts     integer NOT NULL DEFAULT 0,
    last_error   text,
    -- NULL while the relay works on it (or once published); stopped: it failed every attempt and
    -- holds its key; dead: it failed every attempt and was set aside (dead-lettered); skipped: an
    -- operator set it aside.
    status       text,
    CONSTRAINT idem_outbox_pkey PRIMARY KEY (id)
);

CREATE INDEX idem_outbox_pos ON idem_outbox (pos);
CREATE INDEX idem_outbox_xid ON idem_outbox (xid);
-- What an operator looks for: stopped, dead and skipped messages.
CREATE INDEX idem_outbox_status ON idem_outbox (status, pos) WHERE status IS NOT NULL;

-- The lanes: hash(key) mod the number of rows here. Each is owned by one relay at a time through a
-- lease with a fencing token, which every write of the relay's presents. floor is a position
-- below which every message of the lane is settled and none can still commit, where a new owner
-- starts reading; rewind asks the owner to read the lane again from there (an operator retried
-- or skipped a message).
CREATE TABLE idem_outbox_lanes (
    lane       integer NOT NULL,
    owner      text,
    token      uuid,
    expires_at timestamptz,
    floor      bigint NOT NULL DEFAULT 0,
    rewind     bigint,
    CONSTRAINT idem_outbox_lanes_pkey PRIMARY KEY (lane)
);

-- The relays alive, each renewing its row, so that each knows its share of the lanes.
CREATE TABLE idem_outbox_relays (
    owner      text NOT NULL,
    expires_at timestamptz NOT NULL,
    CONSTRAINT idem_outbox_relays_pkey PRIMARY KEY (owner)
);
