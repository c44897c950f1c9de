// Package idemtest gives tests of code that uses idem a Postgres database of their own, with
// idem's tables (and River's, for workflows) already migrated, and drops it when the test is
// done. It is how idem tests itself, made public so that handlers, jobs and workflows built on
// idem can be tested the same way: against a real Postgres, in parallel, with nothing to set up.
//
// It finds a Postgres in this order:
//
//  1. the server named by the TEST_DATABASE_URL environment variable (a postgres:// URL whose
//     user may create databases), as on a CI box with a Postgres service;
//  2. a postgres:16-alpine container through testcontainers-go, when a Docker engine answers
//     within about 1.5 seconds, if the test binary links in github.com/idemkit/idem/idemtest/pgdocker
//     (a module of its own: import it for its effect in a test file, see its doc). Without it,
//     a module that imports idemtest has none of Docker's client modules in its go.mod;
//  3. the local Postgres binaries (initdb and postgres on PATH, in `pg_config --bindir`, or in
//     the newest /usr/lib/postgresql/*/bin), started in a temporary directory on a free port.
//
// When none works, the test fails with an error that says what was tried; it never skips. Each
// test gets a database of its own, named pgtemp_<pid>_<n>, so tests run in parallel. Run the
// test binary through [Main], which stops a server it started and drops whatever databases are
// left (those of runnable examples, which have no cleanup of their own):
//
//	func TestMain(m *testing.M) { os.Exit(idemtest.Main(m)) }
//
//	func TestCreateOrder(t *testing.T) {
//		t.Parallel()
//		pool := idemtest.NewPool(t, nil) // idem's tables are there
//		mw, err := idemhttp.Middleware(pool, &idemhttp.Config{Scope: scope})
//		...
//	}
package idemtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
)

// Opts says what to migrate in a new database. A nil *Opts means the defaults: idem's tables in
// the schema that search_path picks (public), and no River tables.
//
//	pool := idemtest.NewPool(t, &idemtest.Opts{River: true}) // for workflows
type Opts struct {
	// Schema is the Postgres schema for idem's tables, as idem.Schema; it is created if need
	// be. Give the code under test the same schema. Default: "", unqualified.
	Schema string

	// River migrates River's tables too (with rivermigrate, to its latest version), which
	// workflows and anything that inserts River jobs need.
	River bool

	// RiverSchema is the Postgres schema for River's tables, as rivermigrate.Config's Schema.
	// Default: "", unqualified.
	RiverSchema string
}

// migrateTimeout bounds migrating one database.
const migrateTimeout = time.Minute

// Main runs the tests, then drops every database idemtest made that is left and stops the
// Postgres it started, if it started one. It returns the exit code for os.Exit; a database
// left behind, or a server that will not stop, turns a pass into a failure.
//
//	func TestMain(m *testing.M) { os.Exit(idemtest.Main(m)) }
func Main(m *testing.M) int { return pgtemp.Main(m) }

// NewDB creates a fresh database with what opts asks for migrated and returns its URL. The
// database is dropped when the test and its subtests finish. A failure to find a Postgres, or
// to migrate, fails the test.
//
//	func TestWorker(t *testing.T) {
//		t.Parallel()
//		cfg, err := pgxpool.ParseConfig(idemtest.NewDB(t, nil))
//		require.NoError(t, err)
//		cfg.MaxConns = 50
//		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
//		...
//	}
func NewDB(tb testing.TB, opts *Opts) string {
	tb.Helper()
	dbURL := pgtemp.NewDB(tb)
	ctx, cancel := context.WithTimeout(context.Background(), migrateTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		tb.Fatalf("idemtest: error connecting to the new database: %v", err)
	}
	defer pool.Close()
	if err := migrate(ctx, pool, opts, slog.New(slog.NewTextHandler(tb.Output(), nil))); err != nil {
		tb.Fatalf("idemtest: %v", err)
	}
	return dbURL
}

// NewPool returns a pool on a fresh database with what opts asks for migrated. The pool is
// closed when the test ends, and then the database is dropped. The pool holds up to 16
// connections unless TEST_DATABASE_URL sets pool_max_conns; use [NewDB] for a pool of your own.
//
//	func TestTransfer(t *testing.T) {
//		t.Parallel()
//		pool := idemtest.NewPool(t, nil)
//		err := tx.Run(t.Context(), pool, func(ctx context.Context, t pgx.Tx) error {
//			_, err := idem.Do(ctx, t, key, transfer)
//			return err
//		})
//		require.NoError(t, err)
//	}
func NewPool(tb testing.TB, opts *Opts) *pgxpool.Pool {
	tb.Helper()
	pool := pgtemp.NewPool(tb)
	ctx, cancel := context.WithTimeout(context.Background(), migrateTimeout)
	defer cancel()
	if err := migrate(ctx, pool, opts, slog.New(slog.NewTextHandler(tb.Output(), nil))); err != nil {
		tb.Fatalf("idemtest: %v", err)
	}
	return pool
}

// NewExamplePool is [NewPool] for runnable examples, which have no testing.TB: [Main] drops
// the database when the tests are done, and the caller closes the pool. It panics when no
// Postgres can be found or migrating fails, and when the test binary's TestMain does not call
// Main, since nothing would drop the database then.
//
//	func ExampleTransfer() {
//		pool := idemtest.NewExamplePool(nil)
//		defer pool.Close()
//		...
//		// Output: ...
//	}
func NewExamplePool(opts *Opts) *pgxpool.Pool {
	dbURL := pgtemp.NewExampleDB()
	ctx, cancel := context.WithTimeout(context.Background(), migrateTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		panic(fmt.Sprintf("idemtest: error connecting to the new database: %v", err))
	}
	if err := migrate(ctx, pool, opts, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		pool.Close()
		panic("idemtest: " + err.Error())
	}
	return pool
}

func migrate(ctx context.Context, pool *pgxpool.Pool, opts *Opts, logger *slog.Logger) error {
	if opts == nil {
		opts = &Opts{}
	}
	var idemOpts []idem.Option
	if opts.Schema != "" {
		idemOpts = append(idemOpts, idem.Schema(opts.Schema))
	}
	if err := idem.Migrate(ctx, pool, idemOpts...); err != nil {
		return fmt.Errorf("error migrating idem's tables: %w", err)
	}
	if !opts.River {
		return nil
	}
	if opts.RiverSchema != "" {
		// rivermigrate expects its schema to exist; idem.Migrate creates its own.
		if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{opts.RiverSchema}.Sanitize()); err != nil {
			return fmt.Errorf("error creating River's schema: %w", err)
		}
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger, Schema: opts.RiverSchema})
	if err != nil {
		return fmt.Errorf("error migrating River's tables: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("error migrating River's tables: %w", err)
	}
	return nil
}
