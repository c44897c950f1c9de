// Package roundtrip counts what a piece of code costs on the wire, for tests that hold idem to
// its promises about round trips and statements: a dialer that counts round trips (each time the
// client writes after having read, a new request has started) and a pgx tracer that counts
// statements, batched or not.
package roundtrip

import (
	"context"
	"net"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Counter counts round trips and statements on the connections it is installed on. Each
// connection counts its own round trips, so that connections used at once (a workflow's parallel
// branches) are counted as they would be one by one.
//
//	c := &roundtrip.Counter{}
//	cfg.ConnConfig.DialFunc, cfg.ConnConfig.Tracer = c.Dial, c
//	c.Reset()
//	... // the code to measure
//	trips, statements := c.Counts()
type Counter struct {
	mu         sync.Mutex
	trips      int
	statements int
	generation int // of the last Reset: a connection's first write after it starts a round trip
}

// Reset starts counting afresh.
func (c *Counter) Reset() {
	c.mu.Lock()
	c.trips, c.statements = 0, 0
	c.generation++
	c.mu.Unlock()
}

// Counts returns the round trips and statements since the last Reset.
func (c *Counter) Counts() (trips, statements int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.trips, c.statements
}

// Dial is a pgconn DialFunc whose connections count round trips.
func (c *Counter) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, c: c}, nil
}

// TraceQueryStart counts a statement sent on its own.
func (c *Counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	c.statements++
	c.mu.Unlock()
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *Counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart implements pgx.BatchTracer.
func (c *Counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery counts a statement sent in a batch.
func (c *Counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.mu.Lock()
	c.statements++
	c.mu.Unlock()
}

// TraceBatchEnd implements pgx.BatchTracer.
func (c *Counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

type countingConn struct {
	net.Conn
	c          *Counter
	reading    bool // the connection read since it last wrote
	generation int
}

func (cc *countingConn) Write(p []byte) (int, error) {
	cc.c.mu.Lock()
	if cc.reading || cc.generation != cc.c.generation {
		cc.c.trips++
		cc.reading, cc.generation = false, cc.c.generation
	}
	cc.c.mu.Unlock()
	return cc.Conn.Write(p)
}

func (cc *countingConn) Read(p []byte) (int, error) {
	n, err := cc.Conn.Read(p)
	cc.c.mu.Lock()
	cc.reading = true
	cc.c.mu.Unlock()
	return n, err
}
