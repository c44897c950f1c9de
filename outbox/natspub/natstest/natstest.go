// Package natstest runs a NATS server with JetStream inside the process, for tests and demos
// that need a real broker and cannot count on one running: it listens on a free port of the
// loopback interface, keeps its streams in a directory of its own, and can be restarted on the
// same port and directory, as a broker restart mid-stream.
//
//	srv := natstest.New(t) // stopped, and its directory removed, when the test ends
//	nc, err := nats.Connect(srv.ClientURL())
package natstest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server is a NATS server with JetStream, running in this process.
type Server struct {
	*server.Server
	opts *server.Options
}

// Start starts a server that keeps its JetStream data in dir, on a free port of 127.0.0.1.
//
//	srv, err := natstest.Start(dir)
//	if err != nil {
//		return err
//	}
//	defer srv.Shutdown()
func Start(dir string) (*Server, error) {
	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir,
		NoLog: true, NoSigs: true}
	s := &Server{opts: opts}
	if err := s.start(); err != nil {
		return nil, err
	}
	// Restarts keep the port the first start was given.
	opts.Port = s.Addr().(*net.TCPAddr).Port
	return s, nil
}

func (s *Server) start() error {
	srv, err := server.NewServer(s.opts)
	if err != nil {
		return fmt.Errorf("natstest: error making the NATS server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return errors.New("natstest: the NATS server did not get ready within 10s")
	}
	s.Server = srv
	return nil
}

// Restart shuts the server down and starts it again on the same port with the same data, as a
// broker restart: clients lose their connection and reconnect.
//
//	if err := srv.Restart(); err != nil {
//		t.Fatal(err)
//	}
func (s *Server) Restart() error {
	s.Shutdown()
	s.WaitForShutdown()
	return s.start()
}

// New starts a server for tb in a temporary directory, and stops it when tb ends.
//
//	srv := natstest.New(t)
func New(tb testing.TB) *Server {
	tb.Helper()
	dir, err := os.MkdirTemp("", "natstest-")
	if err != nil {
		tb.Fatal(err)
	}
	s, err := Start(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
		_ = os.RemoveAll(dir)
	})
	return s
}
