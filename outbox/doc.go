// Package outbox sends messages to other services through a broker without losing or
// reordering them: [Append] writes a message in the caller's own transaction, beside the
// business writes, and a [Relay] publishes what committed to NATS JetStream, RabbitMQ, Kafka or
// anything a [Publisher] reaches. On the other side, an [Inbox] runs a consumer's handler once
// per message.
//
// # What it guarantees
//
//   - A message is published if and only if the transaction that appended it committed. A
//     transaction that rolls back publishes nothing; a crash after COMMIT loses nothing.
//   - At least once, always under the same message id. A relay that dies between the broker's
//     acknowledgement and its own record publishes the message again after a restart, or
//     another relay does, with the same id; the brokers and the inbox deduplicate on it
//     (JetStream's Nats-Msg-Id, AMQP's message_id, a Kafka header). The package does not
//     promise exactly-once delivery, which no broker gives either; it promises at-least-once
//     delivery and a stable id, and the inbox turns that into effects that happen once.
//   - Per-key order is commit order. The messages of one key are published in the order their
//     transactions committed (Append takes the key's sequence number in the writer's
//     transaction; a second writer of the key waits for the first), and the next one only
//     after the broker acknowledged the one before. Messages of other keys go on meanwhile,
//     many at once. Messages without a key have no order.
//   - One failing message holds up its own key only. The broker's refusals are retried with
//     backoff; after the last attempt the key stops (the default, which keeps its order) or
//     the message is dead-lettered (FailurePolicy.DeadLetter); either is visible and fixable
//     with [List], [Retry] and [Skip], or `idem outbox list|show|retry|skip`.
//   - Nothing else delays the relay: not a long transaction, not a session idle in
//     transaction. The relay reads past a cursor and finds the messages of transactions that
//     commit late by their transaction ids, instead of waiting for the oldest transaction to
//     end.
//
// # Relays and lanes
//
// Keys are spread over lanes (RelayOpts.Lanes, 16 by default) by a hash of the key. Each lane is
// owned by one relay at a time through a lease with a fencing token, which every write of the
// relay's presents: a relay that stalled past its lease cannot record anything for the lanes it
// lost. Relays split the lanes evenly and move them when one joins or dies (within the lease,
// RelayOpts.Lease, and a second or two). Run one in every process of a service, or a few.
//
// # Brokers
//
// The publishers live in modules of their own, so that this module requires no broker client:
// outbox/natspub (JetStream: Nats-Msg-Id, waits for the PubAck, a PubAck marked duplicate
// counts as published), outbox/amqppub (RabbitMQ: publisher confirms, mandatory publishing
// with returned messages as failures, message_id, persistent delivery) and outbox/kafkapub
// (Kafka: the idempotent producer, the record key is the message key, the id in a header).
// [PublisherFunc] makes a publisher of any function that sends one message and waits for its
// acknowledgement.
//
// JetStream drops a message whose Nats-Msg-Id it has seen within the stream's duplicate window
// (two minutes by default, the stream's duplicate_window): a message published again within it
// (a relay restarted after publishing and before recording) is stored once. Past the window, a
// second copy is stored, and consumers see the message twice, with the same id: the inbox makes
// the second one a no-op. Keep the window longer than a relay takes to come back, or rely on the
// inbox.
//
// # The inbox
//
// [Inbox.Handle] runs the consumer's function in a transaction that also records the message
// id (as a key of idem.Do in a scope of the consumer's name), and returns after the COMMIT; the
// consumer acknowledges the broker then. A redelivery finds the record and is acknowledged
// without running the function. Records are kept for InboxOpts.TTL (7 days by default) and
// deleted by idem.Reap.
//
// # Storage
//
// Messages live in idem_outbox, each key's last sequence number in idem_outbox_keys, the lanes
// and live relays in idem_outbox_lanes and idem_outbox_relays (migration 8, outbox; run idem.Migrate).
// idem.Reap deletes messages published longer ago than idem.OutboxRetention (24 hours by
// default); dead-lettered and stopped messages wait for an operator.
//
// A body over 1 KiB is stored apart, in idem_outbox_payloads (migration 11), in the partition of
// the UTC day it was appended on, and read back with one more statement per day when the relay
// reads a batch, or an operator a message; the headers stay in the message's row. idem.Reap
// drops a day's partition whole once no message of that day is left in idem_outbox, instead of
// deleting the bodies one by one; a dead-lettered or stopped message keeps its day's partition
// until an operator retries or skips it and it is reaped. When the day has no partition (Reap and
// Migrate make them ahead), a body stays in its row, so appending never depends on Reap.
package outbox
