// Package faultproxy is a TCP proxy between a Postgres client and server that
// can lose a COMMIT, for tests of code that must cope with a COMMIT whose
// outcome is unknown.
//
// It reads just enough of the frontend/backend protocol to find a COMMIT,
// whether sent as a simple query or through Parse/Bind/Execute (as pgx does in
// a batch), and to tell which ReadyForQuery ends the reply to it. Everything
// else passes through unchanged. It answers SSLRequest and GSSENCRequest
// with 'N', so clients talk plain TCP to it, and so does it to the server.
//
//	proxy, err := faultproxy.New("127.0.0.1:5432")
//	if err != nil {
//		t.Fatal(err)
//	}
//	t.Cleanup(func() { proxy.Close() })
//	pool, err := pgxpool.New(ctx, proxy.URL(dbURL))
//	...
//	proxy.LoseNextCommitReply() // the next COMMIT lands, but its client never hears so
package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
)

// Stats counts what a Proxy has seen and done since New.
type Stats struct {
	Connections       int // client connections that sent a startup message
	CancelRequests    int // connections that sent a CancelRequest (pgx sends one when it closes a broken connection)
	Commits           int // COMMIT statements seen, faulted or not
	LostCommitReplies int // COMMITs forwarded whose reply was discarded
	DroppedCommits    int // COMMITs never forwarded
	Resets            int // connections closed by ResetAll
}

type fault int

const (
	faultLoseReply fault = iota + 1
	faultDrop
)

// Proxy forwards TCP connections to a Postgres server and injects faults into
// them on request. All its methods are safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	sessions map[*session]struct{}
	faults   []fault // pending, in the order requested; each takes one COMMIT
	stats    Stats
}

// New starts a proxy listening on a free port of 127.0.0.1 that forwards
// every connection to target (host:port).
//
//	proxy, err := faultproxy.New(u.Host) // u is the parsed database URL
//	if err != nil {
//		t.Fatal(err)
//	}
//	t.Cleanup(func() { proxy.Close() })
func New(target string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("target must be host:port: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("error listening: %w", err)
	}
	p := &Proxy{target: target, ln: ln, sessions: make(map[*session]struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the host:port the proxy listens on.
//
//	conn, err := pgx.Connect(ctx, "postgres://postgres@"+proxy.Addr()+"/test?sslmode=disable")
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns base with its host and port replaced by the proxy's, so a
// client given the result connects through the proxy. base is a
// postgres:// URL or a keyword/value connection string. It panics when base
// is a URL that does not parse, since that is a bug in the test.
//
//	pool, err := pgxpool.New(ctx, proxy.URL(dbURL))
func (p *Proxy) URL(base string) string {
	host, port, _ := net.SplitHostPort(p.Addr())
	if !strings.Contains(base, "://") {
		// Later keywords override earlier ones, in libpq and pgx alike.
		return strings.TrimSpace(base + " host=" + host + " port=" + port)
	}
	u, err := url.Parse(base)
	if err != nil {
		panic(fmt.Sprintf("faultproxy: error parsing base URL: %v", err))
	}
	u.Host = p.Addr()
	return u.String()
}

// LoseNextCommitReply makes the proxy lose the reply to the next COMMIT on
// any connection: the COMMIT reaches the server, the proxy waits for the
// server's complete reply (so the transaction has really committed, unless
// the server answered with an error), discards it and closes the
// connection. The client sees its connection die during COMMIT.
// Each call affects one COMMIT.
//
//	proxy.LoseNextCommitReply()
//	err := dbtx.Commit(ctx) // fails, yet the rows are there
func (p *Proxy) LoseNextCommitReply() { p.addFault(faultLoseReply) }

// DropNextCommit makes the proxy close the connection that sends the next
// COMMIT instead of forwarding it, so the server rolls the transaction back.
// To the client it looks exactly like LoseNextCommitReply. Each call affects
// one COMMIT.
//
//	proxy.DropNextCommit()
//	err := dbtx.Commit(ctx) // fails, and the rows are not there
func (p *Proxy) DropNextCommit() { p.addFault(faultDrop) }

func (p *Proxy) addFault(f fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = append(p.faults, f)
}

// takeFault counts a COMMIT and returns the fault to apply to it, if any.
func (p *Proxy) takeFault() fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Commits++
	if len(p.faults) == 0 {
		return 0
	}
	f := p.faults[0]
	p.faults = p.faults[1:]
	switch f {
	case faultLoseReply:
		p.stats.LostCommitReplies++
	case faultDrop:
		p.stats.DroppedCommits++
	}
	return f
}

func (p *Proxy) count(f func(*Stats)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(&p.stats)
}

// ResetAll closes every open connection, on both sides, as a server restart
// or a network failure would. New connections are accepted as before.
//
//	proxy.ResetAll()
//	_, err := conn.Exec(ctx, "SELECT 1") // fails: the connection is gone
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	sessions := make([]*session, 0, len(p.sessions))
	for s := range p.sessions {
		sessions = append(sessions, s)
	}
	p.stats.Resets += len(sessions)
	p.mu.Unlock()

	for _, s := range sessions {
		s.close()
	}
}

// Stats returns what the proxy has counted so far.
//
//	require.Equal(t, 1, proxy.Stats().LostCommitReplies)
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close stops listening, closes every open connection and waits for the
// proxy's goroutines to finish. Calling it again does nothing.
//
//	t.Cleanup(func() { proxy.Close() })
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	sessions := make([]*session, 0, len(p.sessions))
	for s := range p.sessions {
		sessions = append(sessions, s)
	}
	p.mu.Unlock()

	err := p.ln.Close()
	for _, s := range sessions {
		s.close()
	}
	p.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("error closing listener: %w", err)
	}
	return nil
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			// The listener only fails for good when closed; Close
			// reports anything worth reporting.
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serve(client)
		}()
	}
}

func (p *Proxy) serve(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		// The client sees its connection closed, as it would if the
		// server were down.
		_ = client.Close()
		return
	}
	s := newSession(p, client, server)

	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		s.close()
		return
	}
	p.sessions[s] = struct{}{}
	p.mu.Unlock()

	s.run()

	p.mu.Lock()
	delete(p.sessions, s)
	p.mu.Unlock()
}
