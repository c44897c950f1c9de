package idem

import (
	"fmt"
	"strings"
)

// buildSchemaSQL is what schema.sql must hold: the version table, every migration's up file in
// order, and the rows that record them, so that Migrate finds a database made from schema.sql
// current. TestSchemaSQL holds schema.sql to it (and rewrites it with IDEM_WRITE_SCHEMA=1).
func buildSchemaSQL(ms []Migration) string {
	var b strings.Builder
	b.WriteString(`-- idem's complete schema, generated from migrations/ (do not edit; see migrate.go): the
-- version table, each migration in order, and the rows that record them. Apply it once with any
-- migration tool; idem.Migrate then finds the database current and applies only later
-- migrations. Names are unqualified: the tables land in the first schema of search_path.

`)
	b.WriteString(migrationsTable)
	b.WriteString(";\n")
	for _, m := range ms {
		fmt.Fprintf(&b, "\n-- %03d_%s\n\n%s", m.Version, m.Name, strings.TrimLeft(m.Up, "\n"))
		if !strings.HasSuffix(m.Up, "\n") {
			b.WriteString("\n")
		}
	}
	b.WriteString("\n")
	for _, m := range ms {
		fmt.Fprintf(&b, "INSERT INTO idem_migrations (version, name) VALUES (%d, '%s');\n", m.Version, m.Name)
	}
	return b.String()
}
