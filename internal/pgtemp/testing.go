package pgtemp

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// sharedStartTimeout allows for pulling a container image on first use.
	sharedStartTimeout = 3 * time.Minute
	// dbOpTimeout bounds creating or dropping one database.
	dbOpTimeout = time.Minute
	// defaultPoolSize is NewPool's MaxConns unless the URL sets
	// pool_max_conns; pgxpool's own default (4 on small machines) is too
	// small for tests that exercise concurrency.
	defaultPoolSize = 16
	// poolCloseTimeout is how long NewPool's cleanup waits for connections
	// still in use.
	poolCloseTimeout = 10 * time.Second
)

// shared is the server of the test binary. A mutex rather than sync.Once
// keeps the result readable by Main without starting a server there.
var shared struct {
	mu      sync.Mutex
	started bool
	srv     *Server
	err     error
	logged  bool
	inMain  bool // Main is running the tests, and will drop what they leave
}

// sharedServer starts the shared server on first use; the caller holds shared.mu.
func sharedServer() (*Server, error) {
	if !shared.started {
		shared.started = true
		ctx, cancel := context.WithTimeout(context.Background(), sharedStartTimeout)
		shared.srv, shared.err = Start(ctx)
		cancel()
	}
	return shared.srv, shared.err
}

// NewExampleDB creates a fresh database on the [Shared] server for a runnable Example, which
// has no testing.TB to report to or clean up with; [Main] drops it when the tests are done. It
// panics when no Postgres can be found, with the error that says what was tried, and when the
// test binary's TestMain does not run [Main], since nothing would drop the database then.
//
//	func ExampleDo() {
//		pool, _ := pgxpool.New(ctx, pgtemp.NewExampleDB())
//		...
//	}
func NewExampleDB() string {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.inMain {
		panic("pgtemp: NewExampleDB needs pgtemp.Main (or idemtest.Main) in the package's TestMain, which drops the database when the tests are done: func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }")
	}
	srv, err := sharedServer()
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dbOpTimeout)
	defer cancel()
	dbURL, err := srv.CreateDatabase(ctx)
	if err != nil {
		panic(fmt.Sprintf("pgtemp: %v", err))
	}
	return dbURL
}

// Shared returns the test binary's Postgres, starting it on first use. Every
// test in the process shares it; give each test its own database with
// [NewDB] or [NewPool] instead of using it directly. When no Postgres can be
// found, the test fails with an error naming what was tried, and so does
// every later caller: startup is not retried.
//
//	func TestRestart(t *testing.T) {
//		srv := pgtemp.Shared(t)
//		if err := srv.Restart(ctx); err != nil {
//			t.Fatal(err)
//		}
//	}
//
// Use [Main] in TestMain so the server is stopped when the tests are done.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if _, err := sharedServer(); err != nil {
		tb.Fatal(err)
	}
	if !shared.logged {
		// Logged once, in the first test to get it, so a failing run shows
		// which Postgres it ran against.
		shared.logged = true
		tb.Log(shared.srv.describe())
	}
	return shared.srv
}

// NewDB creates a fresh, empty database on the [Shared] server and returns
// its URL. The database is dropped when the test and its subtests finish.
// Databases are independent, so tests using NewDB can run in parallel.
//
//	func TestStore(t *testing.T) {
//		t.Parallel()
//		conn, err := pgx.Connect(ctx, pgtemp.NewDB(t))
//		...
//	}
func NewDB(tb testing.TB) string {
	tb.Helper()
	srv := Shared(tb)
	ctx, cancel := context.WithTimeout(context.Background(), dbOpTimeout)
	defer cancel()
	dbURL, err := srv.CreateDatabase(ctx)
	if err != nil {
		tb.Fatalf("pgtemp: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), dbOpTimeout)
		defer cancel()
		if err := srv.DropDatabase(ctx, dbURL); err != nil {
			tb.Errorf("pgtemp: %v", err)
		}
	})
	return dbURL
}

// NewPool returns a pgxpool connected to a fresh database from [NewDB]. The
// pool is closed when the test finishes, before the database is dropped. It
// holds up to 16 connections unless the server URL (for instance
// TEST_DATABASE_URL) sets pool_max_conns.
//
//	func TestStore(t *testing.T) {
//		t.Parallel()
//		pool := pgtemp.NewPool(t)
//		_, err := pool.Exec(ctx, "CREATE TABLE t (id bigint)")
//		require.NoError(t, err)
//	}
func NewPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	dbURL := NewDB(tb)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		tb.Fatalf("pgtemp: error parsing database URL: %v", err)
	}
	if u, err := url.Parse(dbURL); err == nil && !u.Query().Has("pool_max_conns") {
		cfg.MaxConns = defaultPoolSize
	}
	ctx, cancel := context.WithTimeout(context.Background(), dbOpTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("pgtemp: error opening pool: %v", err)
	}
	// Registered after NewDB's drop, so it runs first. pool.Close waits for
	// every acquired connection, so a leaked Rows or Tx would hang the test
	// binary until its timeout; report it instead and let the drop's FORCE
	// end the connection.
	tb.Cleanup(func() {
		closed := make(chan struct{})
		go func() {
			pool.Close()
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(poolCloseTimeout):
			tb.Errorf("pgtemp: pool still had a connection in use %v after the test ended: a Rows, Tx or Conn was not released", poolCloseTimeout)
		}
	})
	return pool
}

// Main runs the tests and then stops the [Shared] server if a test started
// it, removing its temporary files. It returns the exit code for os.Exit.
//
// Before that it drops every database this process created and has not
// dropped, on any [Server] still open (Examples and [NewExampleDB] have no
// cleanup of their own), and, on a server it does not own
// (TEST_DATABASE_URL), checks that no database named for this process is
// left. A database left behind, or a server that will not stop, turns a pass
// into a failure, since it would otherwise pile up unnoticed.
//
//	func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }
func Main(m *testing.M) int { return runMain(m.Run) }

// runMain is Main around any function that runs tests, so that pgtemp's own
// tests can run it in a child process.
func runMain(run func() int) int {
	shared.mu.Lock()
	shared.inMain = true
	shared.mu.Unlock()
	code := run()
	shared.mu.Lock()
	srv := shared.srv
	shared.inMain = false
	shared.mu.Unlock()

	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "pgtemp: "+format+"\n", args...)
		if code == 0 {
			code = 1
		}
	}
	for dbURL, s := range tracked(nil) {
		ctx, cancel := context.WithTimeout(context.Background(), dbOpTimeout)
		if err := s.DropDatabase(ctx, dbURL); err != nil {
			fail("error dropping a database the tests left: %v", err)
		}
		cancel()
	}
	if srv != nil && !srv.Owned() {
		ctx, cancel := context.WithTimeout(context.Background(), dbOpTimeout)
		left, err := srv.ownDatabases(ctx)
		cancel()
		switch {
		case err != nil:
			fail("error checking for databases left on the server: %v", err)
		case len(left) > 0:
			fail("%d databases of this test binary are left on the server: %v", len(left), left)
		}
	}
	if srv != nil {
		if err := srv.Close(); err != nil {
			fail("error stopping the shared server: %v", err)
		}
	}
	return code
}
