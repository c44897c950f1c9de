package idem

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/store"
)

//go:embed schema.sql
var schemaSQL string

//go:embed migrations/*.sql
var migrationFiles embed.FS

// SchemaSQL returns the complete current schema, as in schema.sql at the repository root: every
// migration applied in order, and the version table that records them. Hand it to goose, atlas or
// golang-migrate if you do not want [Migrate] to apply the schema; a later Migrate then finds it
// current. It is equal, table for table, to what Migrate builds (a test holds it to that).
//
//	os.WriteFile("migrations/0001_idem.up.sql", []byte(idem.SchemaSQL()), 0o644)
func SchemaSQL() string { return schemaSQL }

// Migration is one numbered change to idem's schema, as in migrations/NNN_name.up.sql and
// .down.sql.
//
//	for _, m := range idem.Migrations() {
//		fmt.Println(m.Version, m.Name)
//	}
type Migration struct {
	Version int    // 1, 2, ...
	Name    string // from the file name, such as "tables"
	Up      string // SQL that applies it
	Down    string // SQL that reverts it
}

// Migrations returns idem's migrations in order.
//
//	latest := idem.Migrations()[len(idem.Migrations())-1].Version
func Migrations() []Migration {
	ms, err := loadMigrations()
	if err != nil {
		panic(err) // the embedded files are checked by the tests
	}
	return ms
}

func loadMigrations() ([]Migration, error) {
	files, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*Migration{}
	for _, f := range files {
		base := path.Base(f)
		num, rest, ok := strings.Cut(base, "_")
		name, direction, ok2 := strings.Cut(rest, ".")
		version, err := strconv.Atoi(num)
		if !ok || !ok2 || err != nil || version < 1 || (direction != "up.sql" && direction != "down.sql") {
			return nil, fmt.Errorf("idem: migration file %q is not named NNN_name.up.sql or NNN_name.down.sql", base)
		}
		data, err := migrationFiles.ReadFile(f)
		if err != nil {
			return nil, err
		}
		m := byVersion[version]
		if m == nil {
			m = &Migration{Version: version, Name: name}
			byVersion[version] = m
		}
		if m.Name != name {
			return nil, fmt.Errorf("idem: migration %d has two names, %q and %q", version, m.Name, name)
		}
		if direction == "up.sql" {
			m.Up = string(data)
		} else {
			m.Down = string(data)
		}
	}
	ms := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.Up == "" || m.Down == "" {
			return nil, fmt.Errorf("idem: migration %d (%s) needs both an up and a down file", m.Version, m.Name)
		}
		ms = append(ms, *m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("idem: migrations skip from %d to %d", i, m.Version)
		}
	}
	return ms, nil
}

// migrateLockID is the advisory lock that serialises concurrent migrations.
const migrateLockID = int64(0x6964656d_6d696772) // "idemmigr"

// Migrate applies the migrations that the database does not have yet, so that idem's tables are
// current. It is safe to run at every start, and from several processes at once: when nothing is
// pending it only reads the version table, taking no lock on idem's other tables; otherwise it
// takes an advisory lock and applies what is pending in one transaction, recording each version
// in idem_migrations. With the [Schema] option the tables go into that schema, which is created
// if needed.
//
//	if err := idem.Migrate(ctx, pool); err != nil {
//		log.Fatalf("migrating idem: %v", err)
//	}
//
// A database migrated by a newer version of idem is left alone.
func Migrate(ctx context.Context, db Beginner, opts ...Option) error {
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	return migrate(ctx, db, ms[len(ms)-1].Version, false, opts)
}

// MigrateTo moves idem's schema up or down to version: up applies the pending migrations up to
// it, down reverts the applied ones above it with their down files. Version 0 removes idem's
// tables, and the data in them, entirely. See [Migrations] for the versions.
//
//	err := idem.MigrateTo(ctx, pool, 0) // drop idem's tables
func MigrateTo(ctx context.Context, db Beginner, version int, opts ...Option) error {
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	if version < 0 || version > len(ms) {
		return fmt.Errorf("idem: MigrateTo version must be between 0 and %d (got %d)", len(ms), version)
	}
	return migrate(ctx, db, version, true, opts)
}

// SchemaVersion returns the version of idem's schema in the database: the highest migration
// applied, 0 when there is none.
//
//	v, err := idem.SchemaVersion(ctx, pool)
func SchemaVersion(ctx context.Context, db Beginner, opts ...Option) (int, error) {
	cfg := newConfig(opts)
	if cfg.err != nil {
		return 0, cfg.err
	}
	if db == nil {
		return 0, errors.New("idem: SchemaVersion needs a database; db is nil")
	}
	var v int
	err := pgx.BeginFunc(ctx, db, func(t pgx.Tx) error {
		var err error
		v, err = readVersion(ctx, t, cfg.schema)
		return err
	})
	return v, err
}

func migrate(ctx context.Context, db Beginner, target int, down bool, opts []Option) error {
	cfg := newConfig(opts)
	if cfg.err != nil {
		return cfg.err
	}
	if db == nil {
		return errors.New("idem: Migrate needs a database; db is nil")
	}
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	// The common case, at every start of every process: nothing to do. Find that out by reading
	// the version table alone, without the migration lock.
	current, err := SchemaVersion(ctx, db, opts...)
	if err != nil {
		return err
	}
	if current == target || (!down && current > target) {
		return nil
	}

	err = pgx.BeginFunc(ctx, db, func(t pgx.Tx) error {
		if _, err := t.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLockID); err != nil {
			return fmt.Errorf("idem: error taking the migration lock: %w", err)
		}
		if cfg.schema != "" {
			ident := pgx.Identifier{cfg.schema}.Sanitize()
			if _, err := t.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident); err != nil {
				return fmt.Errorf("idem: error creating schema %s: %w", ident, err)
			}
			// SET LOCAL ends with the transaction, so the caller's session keeps its search_path.
			if _, err := t.Exec(ctx, "SET LOCAL search_path TO "+ident); err != nil {
				return fmt.Errorf("idem: error setting search_path: %w", err)
			}
		}
		// Another process may have migrated while this one waited for the lock.
		current, err := readVersion(ctx, t, cfg.schema)
		if err != nil {
			return err
		}
		if current == target || (!down && current > target) {
			return nil
		}
		if current == 0 {
			if _, err := t.Exec(ctx, migrationsTable); err != nil {
				return fmt.Errorf("idem: error creating idem_migrations: %w", err)
			}
		}
		for _, m := range ms {
			switch {
			case current < target && m.Version > current && m.Version <= target:
				if _, err := t.Exec(ctx, m.Up); err != nil {
					return fmt.Errorf("idem: error applying migration %03d_%s: %w", m.Version, m.Name, err)
				}
				if _, err := t.Exec(ctx, "INSERT INTO idem_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
					return fmt.Errorf("idem: error recording migration %03d_%s: %w", m.Version, m.Name, err)
				}
			}
		}
		if current > target {
			for i := len(ms) - 1; i >= 0; i-- {
				m := ms[i]
				if m.Version > current || m.Version <= target {
					continue
				}
				if _, err := t.Exec(ctx, m.Down); err != nil {
					return fmt.Errorf("idem: error reverting migration %03d_%s: %w", m.Version, m.Name, err)
				}
				if _, err := t.Exec(ctx, "DELETE FROM idem_migrations WHERE version = $1", m.Version); err != nil {
					return fmt.Errorf("idem: error recording the revert of migration %03d_%s: %w", m.Version, m.Name, err)
				}
			}
			if target == 0 {
				if _, err := t.Exec(ctx, "DROP TABLE idem_migrations"); err != nil {
					return fmt.Errorf("idem: error dropping idem_migrations: %w", err)
				}
			}
		}
		return nil
	})
	if err != nil || target < payloadsVersion {
		return err
	}
	// The payload tables' first partitions, so that large payloads leave the narrow tables from
	// the start rather than from the first Reap (until a partition exists, they stay inline, so
	// a failure here is worth a warning, not a failed start).
	err = pgx.BeginFunc(ctx, db, func(t pgx.Tx) error {
		_, err := store.For(cfg.schema).CreatePartitions(ctx, t)
		return err
	})
	if err != nil {
		cfg.logger().WarnContext(ctx, "idem: the payload partitions were not made; Reap makes them later, and large payloads stay in their rows meanwhile",
			"error", err)
	}
	return nil
}

// payloadsVersion is the first migration with a table partitioned by day (010_results), whose
// partitions Migrate and MigrateTo make when they leave the schema at it or later.
const payloadsVersion = 10

// migrationsTable records the applied migrations, one row each. schema.sql creates it too.
const migrationsTable = `CREATE TABLE IF NOT EXISTS idem_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`

// readVersion reads the highest applied migration; 0 when the version table does not exist.
//
// It looks the tables up in pg_class rather than with to_regclass: a name lookup that takes no
// lock can answer from the backend's catalog cache, which does not yet know of a table that
// another migrator created while this one waited for the migration lock.
func readVersion(ctx context.Context, t pgx.Tx, schema string) (int, error) {
	tables := store.TablesIn(schema)
	var hasVersions, hasKeys bool
	err := t.QueryRow(ctx, `SELECT
	EXISTS (SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = coalesce($1, current_schema()) AND c.relname = 'idem_migrations'),
	EXISTS (SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = coalesce($1, current_schema()) AND c.relname = 'idem_keys')`, nullable(schema)).Scan(&hasVersions, &hasKeys)
	if err != nil {
		return 0, fmt.Errorf("idem: error reading the schema version: %w", err)
	}
	if !hasVersions {
		if hasKeys {
			return 0, fmt.Errorf("idem: %s exists but %s does not: the tables were made by an unreleased version of idem that kept no version; drop idem_keys and idem_steps and migrate again", tables.Keys, tables.Migrations)
		}
		return 0, nil
	}
	var v int
	if err := t.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+tables.Migrations).Scan(&v); err != nil {
		return 0, fmt.Errorf("idem: error reading the schema version: %w", err)
	}
	return v, nil
}

// nullable turns "" into NULL.
func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}
