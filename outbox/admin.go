package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
)

// Status is where a message stands.
type Status string

// The statuses of a message.
const (
	StatusPending   Status = "pending"   // not yet published; the relay works on it (it may be retrying)
	StatusPublished Status = "published" // the broker acknowledged it
	StatusStopped   Status = "stopped"   // it failed every attempt and holds its key: retry or skip it
	StatusDead      Status = "dead"      // it failed every attempt and was set aside: retry or skip it
	StatusSkipped   Status = "skipped"   // an operator set it aside; it will not be published
)

// Info is a message as an operator sees it.
//
//	info, err := outbox.Get(ctx, pool, id)
//	fmt.Println(info.Status, info.Attempts, info.LastError)
type Info struct {
	ID        uuid.UUID
	Position  int64 // insert order; for one key, commit order
	Topic     string
	Key       string
	Seq       int64  // the key's sequence number; 0 without a key
	Payload   []byte // nil only when a large body was reaped between the read of its row and its own
	Headers   map[string]string
	Status    Status
	Created   time.Time
	Published *time.Time
	Attempts  int    // failed publish attempts
	LastError string // the last failed attempt's error
}

func infoOf(r store.OutboxRow) *Info {
	in := &Info{ID: r.ID, Position: r.Pos, Topic: r.Topic, Key: r.Key, Seq: r.Seq, Payload: r.Payload, Headers: r.Headers,
		Created: time.UnixMicro(r.CreatedUS), Published: r.PublishedAt, Attempts: r.Attempts, LastError: r.LastError, Status: Status(r.Status)}
	switch {
	case r.PublishedAt != nil:
		in.Status = StatusPublished
	case r.Status == "":
		in.Status = StatusPending
	}
	return in
}

// Get reads a message. A message that is not in the outbox (never appended, or reaped) is
// idem.ErrNotFound.
//
//	info, err := outbox.Get(ctx, pool, id)
//	if errors.Is(err, idem.ErrNotFound) { ... }
func Get(ctx context.Context, db Querier, id uuid.UUID, opts ...Option) (*Info, error) {
	cfg := newConfig(opts)
	if cfg.err != nil {
		return nil, cfg.err
	}
	r, err := store.For(cfg.schema).OutboxGet(ctx, db, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: message %s is not in the outbox", idem.ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: error reading message %s: %w", id, err)
	}
	return infoOf(r), nil
}

// ListParams filter [List]. nil lists the messages that need an operator.
//
//	page, err := outbox.List(ctx, pool, &outbox.ListParams{Status: outbox.StatusPending, Topic: "transfer.completed"})
type ListParams struct {
	// Status lists messages in that status; "" lists those that need an operator (stopped,
	// dead and skipped), "all" every message.
	Status Status
	// Topic and Key, when set, list only that topic's or key's messages.
	Topic, Key string
	// After is the position to list after: the last Position of the previous page.
	After int64
	// Limit is how many to list: 100 by default, 1000 at most.
	Limit int
}

// List lists messages in position order (for one key, the order they are published in).
//
//	page, err := outbox.List(ctx, pool, nil) // what needs an operator
//	for _, m := range page {
//		fmt.Println(m.ID, m.Status, m.Topic, m.Key, m.LastError)
//	}
func List(ctx context.Context, db Querier, p *ListParams, opts ...Option) ([]*Info, error) {
	cfg := newConfig(opts)
	if cfg.err != nil {
		return nil, cfg.err
	}
	if p == nil {
		p = &ListParams{}
	}
	sp := store.OutboxListParams{Status: string(p.Status), Topic: p.Topic, Key: p.Key, After: p.After, Limit: p.Limit}
	switch p.Status {
	case "":
		sp.Status = "attention"
	case "all", StatusPending, StatusPublished, StatusStopped, StatusDead, StatusSkipped:
	default:
		return nil, fmt.Errorf("outbox: ListParams.Status %q is not a status; use pending, published, stopped, dead, skipped, all, or \"\" for those that need an operator", p.Status)
	}
	switch {
	case p.Limit < 0 || p.Limit > 1000:
		return nil, fmt.Errorf("outbox: ListParams.Limit must be between 1 and 1000 (got %d)", p.Limit)
	case p.Limit == 0:
		sp.Limit = 100
	}
	rows, err := store.For(cfg.schema).OutboxList(ctx, db, sp)
	if err != nil {
		return nil, fmt.Errorf("outbox: error listing messages: %w", err)
	}
	out := make([]*Info, len(rows))
	for i, r := range rows {
		out[i] = infoOf(r)
	}
	return out, nil
}

// Retry makes the relay publish a stopped, dead-lettered or skipped message again, with its
// attempts reset. A stopped key goes on from it, in order. A dead-lettered or skipped message is
// published after the messages of its key that followed it, which went out meanwhile. Fix what
// made it fail first, or it fails again.
//
//	err := outbox.Retry(ctx, pool, id)
func Retry(ctx context.Context, db idem.Beginner, id uuid.UUID, opts ...Option) error {
	return setStatus(ctx, db, id, "", []string{"stopped", "dead", "skipped"}, "retry", "retried", opts)
}

// Skip sets a stopped or dead-lettered message aside for good: it will not be published, and its
// key goes on with its next message. Reap deletes it after the retention.
//
//	err := outbox.Skip(ctx, pool, id)
func Skip(ctx context.Context, db idem.Beginner, id uuid.UUID, opts ...Option) error {
	return setStatus(ctx, db, id, "skipped", []string{"stopped", "dead"}, "skip", "skipped", opts)
}

func setStatus(ctx context.Context, db idem.Beginner, id uuid.UUID, status string, from []string, verb, done string, opts []Option) error {
	cfg := newConfig(opts)
	if cfg.err != nil {
		return cfg.err
	}
	if db == nil {
		return fmt.Errorf("outbox: %s needs a database; db is nil", verb)
	}
	st := store.For(cfg.schema)
	return pgx.BeginFunc(ctx, db, func(t pgx.Tx) error {
		changed, err := st.OutboxSetStatus(ctx, t, id, status, from)
		if err != nil {
			return fmt.Errorf("outbox: error changing message %s: %w", id, err)
		}
		if changed {
			return nil
		}
		r, err := st.OutboxGet(ctx, t, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: message %s is not in the outbox", idem.ErrNotFound, id)
		}
		if err != nil {
			return fmt.Errorf("outbox: error reading message %s: %w", id, err)
		}
		info := infoOf(r)
		switch info.Status {
		case StatusPublished:
			return fmt.Errorf("outbox: message %s was published at %s; there is nothing to %s", id, info.Published.UTC().Format(time.RFC3339), verb)
		case StatusPending:
			return fmt.Errorf("outbox: message %s is pending (%d failed attempts): the relay is still publishing it; only a stopped or dead-lettered message can be %s",
				id, info.Attempts, done)
		default:
			return fmt.Errorf("outbox: message %s is %s; it cannot be %s", id, info.Status, done)
		}
	})
}

// LaneInfo is a lane as an operator sees it.
type LaneInfo struct {
	Lane    int
	Owner   string     // the relay that holds it; "" for none
	Expires *time.Time // when its lease runs out
	Floor   int64      // every message at or below this position is settled
	Oldest  *time.Time // when its oldest message not yet published was appended; nil for none
}

// Lanes reads the outbox's lanes, for operators: which relay holds each, and how far behind it is.
//
//	lanes, err := outbox.Lanes(ctx, pool)
//	for _, l := range lanes {
//		fmt.Println(l.Lane, l.Owner, l.Oldest)
//	}
func Lanes(ctx context.Context, db Querier, opts ...Option) ([]LaneInfo, error) {
	cfg := newConfig(opts)
	if cfg.err != nil {
		return nil, cfg.err
	}
	rows, err := store.For(cfg.schema).OutboxLanes(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("outbox: error reading lanes: %w", err)
	}
	out := make([]LaneInfo, len(rows))
	for i, r := range rows {
		out[i] = LaneInfo{Lane: int(r.Lane), Owner: r.Owner, Expires: r.Expires, Floor: r.Floor, Oldest: r.Oldest}
	}
	return out, nil
}

// Counts counts the outbox's messages by status. It reads the whole table: for operators and
// tests, not for a hot path.
//
//	n, err := outbox.Counts(ctx, pool)
//	fmt.Println(n[outbox.StatusPending], "to publish,", n[outbox.StatusStopped], "stopped")
func Counts(ctx context.Context, db Querier, opts ...Option) (map[Status]int64, error) {
	cfg := newConfig(opts)
	if cfg.err != nil {
		return nil, cfg.err
	}
	counts, err := store.For(cfg.schema).OutboxCounts(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("outbox: error counting messages: %w", err)
	}
	out := make(map[Status]int64, len(counts))
	for s, n := range counts {
		out[Status(s)] = n
	}
	return out, nil
}
