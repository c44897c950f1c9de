package faultproxy

import (
	"bufio"
	"io"
	"net"
	"sync"
)

// session is one proxied connection: a client and the server connection
// opened for it.
type session struct {
	p         *Proxy
	client    net.Conn
	server    net.Conn
	closeOnce sync.Once

	// Prepared statements and portals that would run a COMMIT, by name.
	// Only the client-to-server goroutine touches them.
	stmts   map[string]bool
	portals map[string]bool

	// The server answers the startup message and every Query, Sync and
	// FunctionCall with exactly one ReadyForQuery, and so numbering them
	// tells which reply belongs to which request, pipelined or not.
	mu     sync.Mutex
	syncs  int // requests sent that will each be answered by a ReadyForQuery
	readys int // ReadyForQuery messages received
	loseAt int // when not 0, the number of the ReadyForQuery ending the reply to lose
}

func newSession(p *Proxy, client, server net.Conn) *session {
	return &session{
		p:       p,
		client:  client,
		server:  server,
		stmts:   make(map[string]bool),
		portals: make(map[string]bool),
	}
}

// run forwards in both directions until either side closes or a fault ends
// the session.
func (s *session) run() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.serverToClient()
		s.close()
	}()
	s.clientToServer()
	s.close()
	<-done
}

// close closes both sides. Closing is how every fault shows itself to the
// client: a connection that dies.
func (s *session) close() {
	s.closeOnce.Do(func() {
		_ = s.client.Close()
		_ = s.server.Close()
	})
}

func (s *session) clientToServer() {
	r := bufio.NewReader(s.client)
	w := bufio.NewWriter(s.server)
	msg, ok := s.startup(r, w)
	if !ok {
		return
	}

	for {
		var err error
		msg, err = readMessage(r, msg)
		if err != nil {
			return
		}
		body := msg[5:]

		var commit, awaitsReady bool
		switch msg[0] {
		case 'Q': // Query
			if ss, err := cstrings(body, 1); err == nil {
				commit = isCommit(ss[0])
			}
			awaitsReady = true
		case 'P': // Parse: statement name, query
			if ss, err := cstrings(body, 2); err == nil {
				s.stmts[ss[0]] = isCommit(ss[1])
			}
		case 'B': // Bind: portal name, statement name
			if ss, err := cstrings(body, 2); err == nil {
				s.portals[ss[0]] = s.stmts[ss[1]]
			}
		case 'E': // Execute: portal name; this is when a COMMIT runs
			if ss, err := cstrings(body, 1); err == nil {
				commit = s.portals[ss[0]]
			}
		case 'C': // Close: 'S' or 'P', then a name
			if len(body) > 0 {
				if ss, err := cstrings(body[1:], 1); err == nil {
					if body[0] == 'S' {
						delete(s.stmts, ss[0])
					} else {
						delete(s.portals, ss[0])
					}
				}
			}
		case 'S', 'F': // Sync, FunctionCall
			awaitsReady = true
		}

		if commit {
			switch s.p.takeFault() {
			case faultDrop:
				// Deliver what came before the COMMIT, as the network
				// would have, then cut both sides.
				_ = w.Flush()
				return
			case faultLoseReply:
				// The reply ends with the ReadyForQuery answering this
				// Query, or the next Sync after this Execute.
				s.mu.Lock()
				s.loseAt = s.syncs + 1
				s.mu.Unlock()
			}
		}
		if awaitsReady {
			s.mu.Lock()
			s.syncs++
			s.mu.Unlock()
		}

		if _, err := w.Write(msg); err != nil {
			return
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

// startup handles the untyped messages a connection begins with. It answers
// SSLRequest and GSSENCRequest itself with 'N' (no encryption), because
// seeing the traffic is the point. It returns a buffer to reuse and whether
// typed messages follow.
func (s *session) startup(r *bufio.Reader, w *bufio.Writer) ([]byte, bool) {
	var msg []byte
	for {
		var err error
		msg, err = readStartup(r, msg)
		if err != nil {
			return nil, false
		}
		switch startupCode(msg) {
		case codeSSLRequest, codeGSSENCRequest:
			if _, err := s.client.Write([]byte{'N'}); err != nil {
				return nil, false
			}
			continue
		case codeCancelRequest:
			// A connection of its own that the server closes after
			// reading the key: pass it along without looking.
			s.p.count(func(st *Stats) { st.CancelRequests++ })
			if _, err := w.Write(msg); err == nil && w.Flush() == nil {
				_, _ = io.Copy(s.server, r)
			}
			return nil, false
		}

		s.p.count(func(st *Stats) { st.Connections++ })
		s.mu.Lock()
		s.syncs = 1 // the server ends authentication with ReadyForQuery
		s.mu.Unlock()
		if _, err := w.Write(msg); err != nil {
			return nil, false
		}
		if err := w.Flush(); err != nil {
			return nil, false
		}
		return msg, true
	}
}

func (s *session) serverToClient() {
	r := bufio.NewReader(s.server)
	w := bufio.NewWriter(s.client)
	var msg []byte
	for {
		var err error
		msg, err = readMessage(r, msg)
		if err != nil {
			_ = w.Flush()
			return
		}

		s.mu.Lock()
		lose := s.loseAt != 0 && s.readys+1 == s.loseAt
		if msg[0] == 'Z' {
			s.readys++
		}
		s.mu.Unlock()

		if lose {
			if msg[0] == 'Z' {
				// The server has answered the COMMIT in full, so the
				// transaction has landed. Deliver replies to earlier
				// requests, then cut the connection.
				_ = w.Flush()
				return
			}
			continue
		}

		if _, err := w.Write(msg); err != nil {
			return
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}
