package idemcli_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/workflow"
)

// TestForgedCursors: a cursor nobody printed, however it is forged (a scope with a NUL byte or
// invalid UTF-8, a time Postgres cannot hold, garbage), is workflow.ErrInvalidCursor from
// RunList and a usage error from the CLI, never an SQL error.
func TestForgedCursors(t *testing.T) {
	t.Parallel()
	bin := build(t)
	b := setup(t, bin)
	require.NoError(t, idem.Migrate(b.ctx, b.pool))
	e, err := workflow.NewEngine(b.pool, &workflow.Config{Logger: quiet()})
	require.NoError(t, err)
	forge := func(json string) string { return base64.RawURLEncoding.EncodeToString([]byte(json)) }
	for _, after := range []string{
		"garbage!", forge(`{"c":1,"s":"a\u0000b","i":"x"}`), forge(`{"c":1,"s":"","i":"x"}`),
		forge(`{"c":9223372036854775807,"s":"s","i":"x"}`), forge(`{"c":-9223372036854775808,"s":"s","i":"x"}`),
		forge(`{"c":1,"s":"s","i":"` + strings.Repeat("x", 300) + `"}`), forge(`{"c":1,"s":"s","i":"has space\u0001"}`),
	} {
		_, err := e.RunList(b.ctx, &workflow.RunListParams{After: after})
		require.ErrorIs(t, err, workflow.ErrInvalidCursor, "cursor %q", after)
		r := b.idem(t, "runs", "list", "--after", after)
		require.Equal(t, 2, r.code, "cursor %q: %s", after, r.stderr)
		require.Contains(t, r.stderr, "not a cursor")
	}
}

// TestMigrateToNegativeAndVersion: --to -1 is not a version (it used to mean "the latest"), and
// --version says which module and which schema version the binary carries.
func TestMigrateToNegativeAndVersion(t *testing.T) {
	t.Parallel()
	b := &testBundle{bin: build(t)}
	for _, to := range []string{"-1", "-2"} {
		r := b.idem(t, "migrate", "--to", to)
		require.Equal(t, 2, r.code, r.stderr)
		require.Contains(t, r.stderr, "--to must be a version from 0 to")
	}
	for _, arg := range []string{"--version", "version"} {
		r := b.idem(t, arg)
		require.Equal(t, 0, r.code, r.stderr)
		require.Contains(t, r.stdout, "github.com/idemkit/idem")
		require.Contains(t, r.stdout, fmt.Sprintf("schema version %d", len(idem.Migrations())))
	}
}

// TestResultsSerialiseLikeRunRow: the result structs a caller may print or return as JSON have
// snake_case JSON names, as RunRow has, not Go's field names.
func TestResultsSerialiseLikeRunRow(t *testing.T) {
	t.Parallel()
	data, err := json.Marshal(workflow.SignalResult{Seq: 3, Duplicate: true})
	require.NoError(t, err)
	require.JSONEq(t, `{"seq":3,"duplicate":true}`, string(data))
}
