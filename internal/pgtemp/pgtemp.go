// Package pgtemp provides a throwaway Postgres for tests and examples.
//
// Every idem package tests against a real Postgres, so pgtemp has to find one
// wherever the tests run. It tries, in order:
//
//  1. the server named by the TEST_DATABASE_URL environment variable (a CI
//     box with a Postgres service);
//  2. a container on a Docker engine, when one answers a ping within about
//     1.5 seconds and the container source is linked in (a test file imports
//     github.com/idemkit/idem/idemtest/pgdocker, a module of its own, so that
//     Docker's client modules stay out of the go.mod of every module that does
//     not ask for them);
//  3. the local Postgres binaries (initdb and postgres on PATH, in
//     `pg_config --bindir`, or in the highest /usr/lib/postgresql/*/bin),
//     started in a temporary directory on a free port with durability turned
//     off (a machine that only has Postgres installed).
//
// When none of them works, the error says what was tried and why each failed.
// Tests fail with that error; they never skip.
//
// Tests use it through [Shared], [NewDB] and [NewPool], with [Main] in
// TestMain so the server is stopped when the test binary is done:
//
//	func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		pool := pgtemp.NewPool(t) // a fresh, empty database of its own
//		...
//	}
package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Sources a Server can come from, as reported by Server.Source.
const (
	sourceEnv       = "TEST_DATABASE_URL"
	sourceContainer = "testcontainers"
	sourceLocal     = "local binaries"
)

// dbPrefix starts the name of every database pgtemp creates. DropDatabase
// refuses any other name, so a wrong URL cannot drop a real database on a
// server named by TEST_DATABASE_URL.
const dbPrefix = "pgtemp_"

// Server is a running Postgres that pgtemp found or started.
//
// Get one from [Start] (or [Shared] in tests), create databases in it with
// [Server.CreateDatabase], and [Server.Close] it when done:
//
//	srv, err := pgtemp.Start(ctx)
//	if err != nil {
//		return err
//	}
//	defer srv.Close()
//	dbURL, err := srv.CreateDatabase(ctx)
type Server struct {
	source  string
	url     *url.URL // admin URL; never modified after Start
	detail  string   // where exactly: binary directory, image, host
	skipped []string // why earlier sources were not used

	admin *pgxpool.Pool

	// mu serializes Restart and Close with each other; database creation
	// does not take it, since the pool tolerates a restart underneath.
	mu            sync.Mutex
	closed        bool
	local         *localServer // set when source is sourceLocal
	stopContainer func() error // set when source is sourceContainer
}

// dbSeq numbers databases across all Servers of the process, so names stay
// unique even when two Servers share one Postgres (TEST_DATABASE_URL).
var dbSeq atomic.Int64

// live is every database this process created and has not dropped, with the
// Server that made it, whichever Server that is: Close drops a shared
// server's databases, and Main drops what is left, so a caller that never
// drops (an Example, a program that stops early) leaves nothing behind on a
// server pgtemp does not own.
var live struct {
	mu  sync.Mutex
	dbs map[string]*Server // database URL -> its server
}

func track(s *Server, dbURL string) {
	live.mu.Lock()
	defer live.mu.Unlock()
	if live.dbs == nil {
		live.dbs = make(map[string]*Server)
	}
	live.dbs[dbURL] = s
}

func untrack(dbURL string) {
	live.mu.Lock()
	defer live.mu.Unlock()
	delete(live.dbs, dbURL)
}

// tracked returns the live databases of s, or of every Server when s is nil.
func tracked(s *Server) map[string]*Server {
	live.mu.Lock()
	defer live.mu.Unlock()
	out := make(map[string]*Server)
	for u, srv := range live.dbs {
		if s == nil || srv == s {
			out[u] = srv
		}
	}
	return out
}

// Start finds or starts a Postgres, trying TEST_DATABASE_URL, then a Docker
// engine (when pgdocker is linked in), then the local binaries. It is for examples and
// tools; tests should use [Shared], [NewDB] or [NewPool], which share one
// server per test binary.
//
//	srv, err := pgtemp.Start(ctx)
//	if err != nil {
//		log.Fatal(err) // names everything that was tried
//	}
//	defer srv.Close()
//	log.Printf("using %s at %s", srv.Source(), srv.URL())
//
// ctx bounds the startup only; the server keeps running until Close.
func Start(ctx context.Context) (*Server, error) {
	var tried []string

	if raw := os.Getenv("TEST_DATABASE_URL"); raw != "" {
		// The user named a server: falling back to another one would hide
		// a misconfiguration, so its failure is final.
		srv, err := startFromURL(ctx, raw)
		if err != nil {
			return nil, fmt.Errorf("pgtemp: error using TEST_DATABASE_URL: %w", err)
		}
		return srv, nil
	}
	tried = append(tried, "TEST_DATABASE_URL not set")

	if containers.Load() == nil {
		tried = append(tried, fmt.Sprintf("docker: not tried, no container source is linked in (a test file with import _ %q uses a Docker engine)", PgdockerPath))
	} else if host, err := probeDocker(ctx, dockerCandidates()); err != nil {
		tried = append(tried, "docker: "+err.Error())
	} else {
		srv, err := startContainer(ctx, host)
		if err == nil {
			srv.skipped = tried
			return srv, nil
		}
		tried = append(tried, fmt.Sprintf("docker: engine at %s answered but the container failed: %v", host, err))
	}

	srv, err := startLocal(ctx)
	if err == nil {
		srv.skipped = tried
		return srv, nil
	}
	tried = append(tried, "local binaries: "+err.Error())

	return nil, fmt.Errorf("pgtemp: no Postgres: %s", strings.Join(tried, "; "))
}

// startFromURL wraps an existing server; pgtemp only creates and drops
// databases in it.
func startFromURL(ctx context.Context, raw string) (*Server, error) {
	u, err := parseURL(raw)
	if err != nil {
		return nil, err
	}
	srv := &Server{source: sourceEnv, url: u, detail: u.Host}
	if err := srv.openAdmin(ctx); err != nil {
		return nil, err
	}
	return srv, nil
}

// parseURL accepts only URL-form connection strings, because pgtemp derives
// database URLs by replacing the path. It adds sslmode=disable unless the
// URL chose an sslmode itself: a CI server may require TLS.
func parseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("error parsing database URL: %w", err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return nil, errors.New("database URL must start with postgres:// or postgresql://")
	}
	q := u.Query()
	if q.Get("sslmode") == "" {
		q.Set("sslmode", "disable")
		u.RawQuery = q.Encode()
	}
	return u, nil
}

// openAdmin connects the small pool used to create and drop databases and
// checks that the server answers, so Start fails early with a clear error.
func (s *Server) openAdmin(ctx context.Context) error {
	cfg, err := pgxpool.ParseConfig(s.url.String())
	if err != nil {
		return fmt.Errorf("error parsing database URL: %w", err)
	}
	// CREATE DATABASE is serialized by Postgres anyway; a few connections
	// are enough for many parallel tests.
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("error connecting to postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return fmt.Errorf("error connecting to postgres at %s: %w", s.url.Redacted(), err)
	}
	s.admin = pool
	return nil
}

// URL returns the admin URL of the server: database postgres for servers
// pgtemp started, or the database named in TEST_DATABASE_URL. Create a
// database with [Server.CreateDatabase] rather than using it directly.
//
//	conn, err := pgx.Connect(ctx, srv.URL())
func (s *Server) URL() string { return s.url.String() }

// Source says where the server came from: "TEST_DATABASE_URL",
// "testcontainers" or "local binaries".
//
//	if srv.Source() == "local binaries" {
//		// Restart is available.
//	}
func (s *Server) Source() string { return s.source }

// Owned reports whether pgtemp started the server (a container or local
// binaries), and so whether Close stops it.
//
//	if !srv.Owned() {
//		// Someone else's server: leave it as found.
//	}
func (s *Server) Owned() bool { return s.source != sourceEnv }

// Tried says why the sources before the server's were not used.
//
//	log.Printf("skipped: %s", strings.Join(srv.Tried(), "; "))
func (s *Server) Tried() []string { return s.skipped }

// describe says which server is in use and why earlier sources were not,
// for test logs.
func (s *Server) describe() string {
	d := fmt.Sprintf("pgtemp: using %s (%s) at %s", s.source, s.detail, s.url.Redacted())
	if len(s.skipped) > 0 {
		d += "; skipped: " + strings.Join(s.skipped, "; ")
	}
	return d
}

// CreateDatabase creates a fresh, uniquely named, empty database (named
// pgtemp_<pid>_<n>) and returns its URL, which keeps the admin URL's
// parameters. [Server.Close] drops it, if nothing has before, and so does
// [Main] at the end of a test binary.
//
//	dbURL, err := srv.CreateDatabase(ctx)
//	if err != nil {
//		return err
//	}
//	defer srv.DropDatabase(context.Background(), dbURL)
//	pool, err := pgxpool.New(ctx, dbURL)
func (s *Server) CreateDatabase(ctx context.Context) (string, error) {
	// Another process on the same TEST_DATABASE_URL server from another
	// machine can have our pid; on a clash, take the next number.
	for range 10 {
		name := fmt.Sprintf("%s%d_%d", dbPrefix, os.Getpid(), dbSeq.Add(1))
		_, err := s.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database
			continue
		}
		if err != nil {
			return "", fmt.Errorf("error creating database %s: %w", name, err)
		}
		u := *s.url
		u.Path = "/" + name
		u.RawPath = ""
		track(s, u.String())
		return u.String(), nil
	}
	return "", errors.New("error creating database: ten names in a row already existed")
}

// DropDatabase drops a database made by [Server.CreateDatabase], ending any
// connections still open to it (DROP DATABASE ... WITH (FORCE)). Dropping a
// database that is already gone is not an error. It refuses names that do
// not start with pgtemp_, so it cannot drop a real database by mistake.
//
//	if err := srv.DropDatabase(ctx, dbURL); err != nil {
//		return err
//	}
func (s *Server) DropDatabase(ctx context.Context, dbURL string) error {
	u, err := url.Parse(dbURL)
	if err != nil {
		return fmt.Errorf("error parsing database URL: %w", err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	if !strings.HasPrefix(name, dbPrefix) {
		return fmt.Errorf("database %q was not created by pgtemp; refusing to drop it", name)
	}
	_, err = s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	if err != nil {
		return fmt.Errorf("error dropping database %s: %w", name, err)
	}
	untrack(dbURL)
	return nil
}

// ownDatabases lists the databases on the server named for this process
// (pgtemp_<pid>_<n>), dropped or not by whoever made them.
func (s *Server) ownDatabases(ctx context.Context) ([]string, error) {
	rows, err := s.admin.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE $1 ORDER BY datname`,
		fmt.Sprintf("%s%d\\_%%", strings.ReplaceAll(dbPrefix, "_", "\\_"), os.Getpid()))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Restart stops the server with a fast shutdown and starts it again on the
// same port and data directory, so URLs stay valid and data survives. Open
// connections are ended, as in a real restart. Only servers pgtemp started
// from the local binaries can restart; for others it returns an error.
//
//	if err := srv.Restart(ctx); err != nil {
//		t.Fatal(err)
//	}
//	// Pools reconnect on their next use.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("error restarting postgres: server is closed")
	}
	if s.local == nil {
		return fmt.Errorf("error restarting postgres: only local binaries can restart, and this server came from %s", s.source)
	}
	err := s.local.restart(ctx)
	// Connections to the old server are dead; drop them now rather than
	// fail the next CreateDatabase.
	s.admin.Reset()
	if err != nil {
		return fmt.Errorf("error restarting postgres: %w", err)
	}
	return nil
}

// Close stops what pgtemp started and removes its temporary files. For a
// TEST_DATABASE_URL server, which it does not stop, it drops the databases
// it created there and has not dropped yet, then closes its own
// connections. Calling it again does nothing.
//
//	srv, err := pgtemp.Start(ctx)
//	if err != nil {
//		return err
//	}
//	defer srv.Close()
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	for dbURL := range tracked(s) {
		if s.Owned() {
			untrack(dbURL) // goes with the server
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		errs = append(errs, s.DropDatabase(ctx, dbURL))
		cancel()
	}
	if s.admin != nil {
		s.admin.Close()
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	switch {
	case s.local != nil:
		return s.local.close()
	case s.stopContainer != nil:
		return s.stopContainer()
	}
	return nil
}
