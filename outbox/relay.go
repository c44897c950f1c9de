package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/store"
)

// Querier sends statements: *pgxpool.Pool, *pgxpool.Conn and *pgx.Conn satisfy it. The relay
// sends each statement on its own, outside any transaction, so give it a pool.
//
//	var db outbox.Querier = pool
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Relay publishes the outbox's messages to a broker: at least once, always under the message's
// id, and the messages of one key in the order their transactions committed, each only after
// the broker acknowledged the one before.
//
// Relays share the work through lanes (a key's lane is a hash of the key modulo the number of
// lanes): each lane is owned by one relay at a time, through a lease with a fencing token that
// every write of the relay's presents, so a relay that lost a lane (it stalled past its lease)
// cannot mark the lane's messages. Run as many relays as you like, one per process of a
// service, say: they split the lanes evenly, and a relay that joins or dies makes the lanes
// move within the lease and a second or two.
//
// Within its lanes a relay keeps many keys in flight at once, publishes in batches, and records
// published messages in batches. It reads new messages past a cursor, and finds those of
// transactions that committed late (after it had read past their positions) by their
// transaction ids: an unrelated long transaction, or a session idle in transaction, delays
// nothing. A transaction of the relay's own process that appends a message wakes it up; other
// writers are found by polling, at once while there is work and backing off to
// RelayOpts.PollInterval when there is none.
//
//	relay, err := outbox.NewRelay(pool, natspub.New(js, nil), nil)
//	if err != nil {
//		return err
//	}
//	go func() {
//		if err := relay.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
//			log.Printf("outbox relay: %v", err)
//		}
//	}()
type Relay struct {
	db      Querier
	pub     Publisher
	cfg     *relayConfig
	st      *store.Statements
	tel     *relayTelemetry
	running atomic.Bool
}

// NewRelay makes a relay that publishes with pub the messages in db, a pool of the database
// that holds the outbox. It checks opts and touches nothing; [Relay.Run] starts it.
//
//	relay, err := outbox.NewRelay(pool, pub, &outbox.RelayOpts{Lanes: 32})
func NewRelay(db Querier, pub Publisher, opts *RelayOpts) (*Relay, error) {
	if db == nil {
		return nil, errors.New("outbox: NewRelay needs a database; db is nil")
	}
	if pub == nil {
		return nil, errors.New("outbox: NewRelay needs a publisher; pub is nil")
	}
	cfg, err := newRelayConfig(opts)
	if err != nil {
		return nil, err
	}
	return &Relay{db: db, pub: pub, cfg: cfg, st: store.For(cfg.Schema), tel: newRelayTelemetry(cfg.TracerProvider, cfg.MeterProvider)}, nil
}

// Name returns the relay's name, as operators see it in the lanes it owns.
//
//	log.Printf("outbox relay %s started", relay.Name())
func (r *Relay) Name() string { return r.cfg.Name }

// Run relays until ctx ends, and then returns ctx's error, after it has waited for the batches
// in flight (up to PublishTimeout), recorded what they published, and given up its lanes so
// that other relays take them over at once. It returns early with an error only when the relay
// cannot start: the outbox's tables are missing, or the lanes were made by a relay with
// another RelayOpts.Lanes. A database or broker that goes away meanwhile is waited for, and
// logged.
//
// A Relay runs once at a time.
//
//	err := relay.Run(ctx) // blocks; returns context.Canceled after ctx is cancelled
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("outbox: Relay.Run is already running; make a second Relay to run two")
	}
	defer r.running.Store(false)
	lanes, err := r.initLanes(ctx)
	if err != nil {
		return err
	}
	l := newLoop(r, lanes)
	register(l)
	defer unregister(l)
	unobserve := r.tel.observeLag(l)
	defer unobserve()
	return l.run(ctx)
}

// initLanes makes the lanes if there are none yet and checks that their number is this relay's.
func (r *Relay) initLanes(ctx context.Context) (int, error) {
	want := r.cfg.Lanes
	if want == 0 {
		want = DefaultLanes
	}
	var n int
	poll := backoff.NewPoll(30*time.Second, 50*time.Millisecond, time.Second)
	for {
		var err error
		n, err = r.st.OutboxLanesInit(ctx, r.db, want)
		if err == nil {
			break
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
			return 0, fmt.Errorf("outbox: the outbox's tables are missing (%s): run idem.Migrate first, with RelayOpts.Schema as its Schema: %w", pgErr.Message, err)
		}
		r.cfg.Logger.WarnContext(ctx, "outbox: relay cannot reach the database; retrying", "relay", r.cfg.Name, "error", err)
		if again, perr := poll.Next(ctx); perr != nil || !again {
			return 0, fmt.Errorf("outbox: error making the outbox's lanes: %w", err)
		}
	}
	if n < 1 {
		return 0, errors.New("outbox: the outbox has no lanes; another relay is making them, or idem_outbox_lanes was emptied by hand: start the relay again")
	}
	if r.cfg.Lanes != 0 && n != r.cfg.Lanes {
		return 0, fmt.Errorf("outbox: RelayOpts.Lanes is %d, but the outbox has %d lanes, made by the first relay that ran on this database; give every relay the same number, or 0 to take the outbox's", r.cfg.Lanes, n)
	}
	return n, nil
}

// local are the relays running in this process, which Append wakes up.
var local struct {
	mu    sync.Mutex
	loops atomic.Pointer[[]*loop]
}

func register(l *loop) {
	local.mu.Lock()
	defer local.mu.Unlock()
	var next []*loop
	if cur := local.loops.Load(); cur != nil {
		next = append(next, *cur...)
	}
	next = append(next, l)
	local.loops.Store(&next)
}

func unregister(l *loop) {
	local.mu.Lock()
	defer local.mu.Unlock()
	var next []*loop
	if cur := local.loops.Load(); cur != nil {
		for _, x := range *cur {
			if x != l {
				next = append(next, x)
			}
		}
	}
	local.loops.Store(&next)
}

// nudgeLocal wakes the relays of this process: a transaction has appended a message and will
// commit it soon.
func nudgeLocal() {
	if cur := local.loops.Load(); cur != nil {
		for _, l := range *cur {
			select {
			case l.nudge <- struct{}{}:
			default:
			}
		}
	}
}
