package idem

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// SchemaSQL is the whole schema, as in schema.sql at the repository root. Every statement is
// idempotent. Hand it to a migration tool if you do not want [Migrate] to apply it.
//
//	os.WriteFile("migrations/0001_idem.up.sql", []byte(idem.SchemaSQL), 0o644)
//
//go:embed schema.sql
var SchemaSQL string

// Beginner begins a transaction. *pgxpool.Pool, *pgx.Conn and pgx.Tx (a savepoint) satisfy it.
//
//	var db idem.Beginner = pool // or conn, or an open pgx.Tx
//	err := idem.Migrate(ctx, db)
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// migrateLockID is the advisory lock that serialises concurrent Migrate calls: CREATE ... IF NOT
// EXISTS is not safe against itself running at the same moment in two sessions.
const migrateLockID = int64(0x6964656d_6d696772) // "idemmigr"

// Migrate creates or updates idem's tables. It is safe to run at every start, and from several
// processes at once: it takes an advisory lock and applies [SchemaSQL] in one transaction. With
// the [Schema] option the tables go into that schema, which is created if needed.
//
//	if err := idem.Migrate(ctx, pool); err != nil {
//		log.Fatalf("migrating idem: %v", err)
//	}
func Migrate(ctx context.Context, db Beginner, opts ...Option) error {
	cfg := newConfig(opts)
	if cfg.err != nil {
		return cfg.err
	}
	return pgx.BeginFunc(ctx, db, func(t pgx.Tx) error {
		if _, err := t.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLockID); err != nil {
			return fmt.Errorf("error taking the migration lock: %w", err)
		}
		if cfg.schema != "" {
			ident := pgx.Identifier{cfg.schema}.Sanitize()
			if _, err := t.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident); err != nil {
				return fmt.Errorf("error creating schema %s: %w", ident, err)
			}
			// SET LOCAL ends with the transaction, so the caller's session keeps its search_path.
			if _, err := t.Exec(ctx, "SET LOCAL search_path TO "+ident); err != nil {
				return fmt.Errorf("error setting search_path: %w", err)
			}
		}
		// Even a no-op ALTER TABLE ... IF NOT EXISTS takes an ACCESS EXCLUSIVE lock, which would
		// stall every transaction on idem_keys at each start of each process. So the schema's
		// digest is kept as a comment on the table, and a schema that is current is left alone.
		digest := schemaDigest()
		var current bool
		if err := t.QueryRow(ctx, `SELECT coalesce(obj_description(to_regclass('idem_keys'), 'pg_class') = $1, false)`, digest).Scan(&current); err != nil {
			return fmt.Errorf("error reading idem schema version: %w", err)
		}
		if current {
			return nil
		}
		if _, err := t.Exec(ctx, SchemaSQL); err != nil {
			return fmt.Errorf("error applying idem schema: %w", err)
		}
		if _, err := t.Exec(ctx, "COMMENT ON TABLE idem_keys IS '"+digest+"'"); err != nil {
			return fmt.Errorf("error recording idem schema version: %w", err)
		}
		return nil
	})
}

// schemaDigest names the exact schema.sql applied, as recorded on idem_keys by Migrate.
func schemaDigest() string {
	sum := sha256.Sum256([]byte(SchemaSQL))
	return "idem schema " + hex.EncodeToString(sum[:8])
}
