package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/outbox/natspub/natstest"
	"github.com/idemkit/idem/tx"
)

const (
	benchKeys     = 10000
	benchWriters  = 8
	payloadSize   = 1024
	streamName    = "BENCH"
	streamSubject = "bench.events"
)

// env is what every run shares: a Postgres server and a NATS server.
type env struct {
	pg      *pgtemp.Server
	nats    *natstest.Server
	natsDir string
	nc      *nats.Conn
	js      jetstream.JetStream
}

func newEnv(ctx context.Context) (*env, error) {
	e := &env{}
	var err error
	if e.pg, err = pgtemp.Start(ctx); err != nil {
		return nil, err
	}
	if e.natsDir, err = os.MkdirTemp("", "outbox-bench-nats-"); err != nil {
		return nil, err
	}
	if e.nats, err = natstest.Start(e.natsDir); err != nil {
		return nil, err
	}
	if e.nc, err = nats.Connect(e.nats.ClientURL()); err != nil {
		return nil, err
	}
	if e.js, err = jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(16384)); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *env) close() {
	e.nc.Close()
	e.nats.Shutdown()
	e.nats.WaitForShutdown()
	_ = os.RemoveAll(e.natsDir)
	_ = e.pg.Close()
}

// run is one variant on a fresh database and a fresh stream.
type run struct {
	e       *env
	v       variant
	dbURL   string
	pool    *pgxpool.Pool
	payload []byte

	mu        sync.Mutex
	committed map[string]time.Time
	lat       []sample

	appended atomic.Int64
	acked    atomic.Int64
	seen     sync.Map // id -> true, for distinct acks
	repeats  atomic.Int64
}

type sample struct {
	committed time.Time
	latency   time.Duration
}

func newRun(ctx context.Context, e *env, v variant) (*run, error) {
	r := &run{e: e, v: v, committed: map[string]time.Time{}, payload: []byte(`"` + string(make([]byte, 0)) + randomText(payloadSize-2) + `"`)}
	var err error
	if r.dbURL, err = e.pg.CreateDatabase(ctx); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(r.dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 32
	if r.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	if err := idem.Migrate(ctx, r.pool); err != nil {
		return nil, err
	}
	if _, err := r.pool.Exec(ctx, `CREATE TABLE accounts (id int PRIMARY KEY, n bigint NOT NULL);
		INSERT INTO accounts SELECT g, 0 FROM generate_series(1, 10000) g`); err != nil {
		return nil, err
	}
	if err := v.setup(ctx, r.pool); err != nil {
		return nil, err
	}
	_ = e.js.DeleteStream(ctx, streamName)
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: streamName, Subjects: []string{streamSubject}, Storage: jetstream.FileStorage,
		Duplicates: 2 * time.Minute}); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *run) close(ctx context.Context) {
	r.pool.Close()
	_ = r.e.pg.DropDatabase(ctx, r.dbURL)
}

func randomText(n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rand.IntN(len(letters))]
	}
	return string(b)
}

// ack is called when the broker acknowledged id.
func (r *run) ack(id string) {
	now := time.Now()
	if _, dup := r.seen.LoadOrStore(id, true); dup {
		r.repeats.Add(1)
		return
	}
	r.acked.Add(1)
	r.mu.Lock()
	if c, ok := r.committed[id]; ok {
		r.lat = append(r.lat, sample{committed: c, latency: now.Sub(c)})
		delete(r.committed, id)
	}
	r.mu.Unlock()
}

// writeTx runs one business transaction with n messages.
func (r *run) writeTx(ctx context.Context, n int) error {
	msgs := make([]benchMsg, n)
	for i := range msgs {
		msgs[i] = benchMsg{id: newID(), key: "key-" + strconv.Itoa(rand.IntN(benchKeys)), payload: r.payload}
	}
	err := tx.Run(ctx, r.pool, func(ctx context.Context, t pgx.Tx) error {
		if _, err := t.Exec(ctx, `UPDATE accounts SET n = n + 1 WHERE id = $1`, 1+rand.IntN(benchKeys)); err != nil {
			return err
		}
		return r.v.appendTx(ctx, t, msgs)
	})
	if err != nil {
		return err
	}
	now := time.Now()
	r.mu.Lock()
	for _, m := range msgs {
		if _, acked := r.seen.Load(m.id); !acked { // the relay may be faster than this line
			r.committed[m.id] = now
		}
	}
	r.mu.Unlock()
	r.appended.Add(int64(n))
	return nil
}

// write offers rate msg/s in transactions of perTx from benchWriters writers until ctx ends; a
// writer that falls behind its schedule writes as fast as it can.
func (r *run) write(ctx context.Context, rate float64, perTx int) error {
	interval := time.Duration(float64(time.Second) * float64(benchWriters*perTx) / rate)
	var wg sync.WaitGroup
	errs := make(chan error, benchWriters)
	start := time.Now()
	for w := range benchWriters {
		wg.Go(func() {
			next := start.Add(time.Duration(w) * interval / benchWriters)
			for ctx.Err() == nil {
				if d := time.Until(next); d > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(d):
					}
				}
				next = next.Add(interval)
				if err := r.writeTx(ctx, perTx); err != nil && ctx.Err() == nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// percentiles of the latencies of messages committed in [from, to).
func (r *run) percentiles(from, to time.Time) (p50, p99, worst time.Duration, n int) {
	r.mu.Lock()
	var ls []time.Duration
	for _, s := range r.lat {
		if !s.committed.Before(from) && s.committed.Before(to) {
			ls = append(ls, s.latency)
		}
	}
	r.mu.Unlock()
	if len(ls) == 0 {
		return 0, 0, 0, 0
	}
	slices.Sort(ls)
	return ls[len(ls)*50/100], ls[min(len(ls)-1, len(ls)*99/100)], ls[len(ls)-1], len(ls)
}

// drain waits until every appended message was acknowledged, for at most limit.
func (r *run) drain(limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for r.acked.Load() < r.appended.Load() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }
