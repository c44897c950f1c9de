package idemriver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemkit/idem"
)

// MigrateConfig configures [Migrate]. nil means the defaults: idem's and River's tables where
// search_path puts them.
//
//	cfg := &idemriver.MigrateConfig{Options: []idem.Option{idem.Schema("idem")}, RiverSchema: "river"}
type MigrateConfig struct {
	// Options are passed to idem.Migrate: idem.Schema names the schema of idem's tables.
	Options []idem.Option

	// RiverSchema is the schema of River's tables, as rivermigrate.Config's Schema; it is
	// created if need be. Default "": search_path decides.
	RiverSchema string

	// Logger receives rivermigrate's log of the migrations it applies. Default: slog.Default().
	Logger *slog.Logger
}

// migrateLockID is the session advisory lock that Migrate holds while it migrates.
const migrateLockID = int64(0x6964656d_72697672) // "idemrivr"

// Migrate brings idem's tables and River's up to date, under one advisory lock, so that any
// number of processes may call it at once when they start: one migrates, the others wait for
// it, find both schemas current and return. River's migrator (rivermigrate in River v0.51) takes
// no lock: two processes that run it at once, on a new database, race on its CREATE statements,
// and one of them fails to start. Call Migrate instead of idem.Migrate and rivermigrate at every
// start; every process that migrates must use it, since the lock serialises only its callers
// (and idem.Migrate's).
//
//	if err := idemriver.Migrate(ctx, pool, nil); err != nil {
//		log.Fatalf("migrating: %v", err)
//	}
//
// The lock is a session lock, held by one connection of pool from before idem's migration to
// after River's, which run on pool's other connections: pool needs at least two. It is released
// when Migrate returns, whatever happened; a connection whose lock could not be released is
// closed, which releases it too.
func Migrate(ctx context.Context, pool *pgxpool.Pool, cfg *MigrateConfig) error {
	if pool == nil {
		return errors.New("idemriver: Migrate needs a pool; pool is nil")
	}
	c := MigrateConfig{}
	if cfg != nil {
		c = *cfg
	}
	if err := idem.CheckOptions(c.Options...); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: c.Logger, Schema: c.RiverSchema})
	if err != nil {
		return fmt.Errorf("idemriver: error making River's migrator: %w", err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("idemriver: error acquiring a connection for the migration lock: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrateLockID); err != nil {
		closeConn(conn) // the wait may have been cut off after the lock was granted
		return fmt.Errorf("idemriver: error taking the migration lock: %w", err)
	}
	defer func() {
		uctx := context.WithoutCancel(ctx)
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", migrateLockID); err != nil {
			closeConn(conn)
		}
	}()
	if err := idem.Migrate(ctx, conn, c.Options...); err != nil {
		return err
	}
	if c.RiverSchema != "" {
		// rivermigrate expects its schema to exist.
		if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{c.RiverSchema}.Sanitize()); err != nil {
			return fmt.Errorf("idemriver: error creating River's schema %q: %w", c.RiverSchema, err)
		}
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("idemriver: error migrating River's tables: %w", err)
	}
	return nil
}

// closeConn ends conn's session, so that the pool drops it and Postgres releases what the
// session held.
func closeConn(conn *pgxpool.Conn) {
	_ = conn.Conn().Close(context.Background())
}
