package store

import (
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite testdata/statements.golden from the statements as they are")

// statementTexts lists every statement text of st by the field that holds it, found by
// reflection so that a statement added later is held to the golden file too.
func statementTexts(st *Statements) map[string]string {
	texts := map[string]string{}
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		switch v.Kind() {
		case reflect.String:
			texts[prefix] = v.String()
		case reflect.Struct:
			for i := range v.NumField() {
				walk(prefix+"."+v.Type().Field(i).Name, v.Field(i))
			}
		}
	}
	v := reflect.ValueOf(st).Elem()
	for i := range v.NumField() {
		if name := v.Type().Field(i).Name; name != "Tables" && name != "schema" && name != "clock" {
			walk(name, v.Field(i))
		}
	}
	since := time.Unix(0, 0)
	texts["listRuns(all filters)"], _ = st.listRuns(RunFilter{States: []string{"failed"}, Workflows: []string{"w"},
		Versions: []string{"v"}, Scope: "s", Since: &since, Until: &since, After: &RunCursor{}, Limit: 1})
	return texts
}

// TestStatementTexts holds the text of every statement that production engines send to
// testdata/statements.golden: the clock seam (ForClock) must leave them exactly as they are,
// so that a change to a production statement is a deliberate edit of the golden file, reviewed
// as such. Regenerate it with go test ./internal/store -run TestStatementTexts -update.
func TestStatementTexts(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	for _, schema := range []string{"", "app"} {
		texts := statementTexts(For(schema))
		names := make([]string, 0, len(texts))
		for name := range texts {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			b.WriteString("-- " + schema + " " + name + "\n" + texts[name] + "\n\n")
		}
	}
	golden := filepath.Join("testdata", "statements.golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(golden, []byte(b.String()), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	require.Equal(t, string(want), b.String(), "a production statement changed; if on purpose, rerun with -update and review the diff")
}

// TestVirtualClockTexts: the test engine's statements read the virtual clock everywhere the
// production ones read Postgres's, and no placeholder is left unrendered in either.
func TestVirtualClockTexts(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{"", "app"} {
		prod, virtual := statementTexts(For(schema)), statementTexts(ForVirtualClock(schema))
		require.Equal(t, len(prod), len(virtual))
		placeholder := regexp.MustCompile(`\{[a-z_]+\}`)
		for name, text := range virtual {
			require.False(t, placeholder.MatchString(text), "%s has a placeholder left", name)
			require.False(t, placeholder.MatchString(prod[name]), "%s has a placeholder left", name)
			if strings.Contains(name, "runs.") || strings.Contains(name, "waits.") || strings.Contains(name, "admin.") {
				require.Equal(t, strings.Count(prod[name], "now()")+strings.Count(prod[name], "statement_timestamp()"),
					strings.Count(text, ClockTable), "%s: every read of the time goes through the virtual clock", name)
			}
		}
	}
}
