package idem

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSchemaSQLText keeps schema.sql equal to what the migrations say it is. Run with
// IDEM_WRITE_SCHEMA=1 to rewrite it after adding a migration. TestSchemaSQL (in the external
// tests) checks the same against a real Postgres, table by table.
func TestSchemaSQLText(t *testing.T) {
	t.Parallel()
	ms, err := loadMigrations()
	require.NoError(t, err)
	want := buildSchemaSQL(ms)
	if os.Getenv("IDEM_WRITE_SCHEMA") == "1" {
		require.NoError(t, os.WriteFile("schema.sql", []byte(want), 0o644))
		return
	}
	require.Equal(t, want, SchemaSQL(), "schema.sql is out of date: run IDEM_WRITE_SCHEMA=1 go test -run TestSchemaSQLText .")
}
