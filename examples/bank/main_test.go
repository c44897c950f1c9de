package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/pgtemp"
)

func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }

// TestDemo plays the README's first command end to end against a pgtemp database: it fails if
// any claim the demo makes, or any invariant it checks in Postgres, does not hold.
func TestDemo(t *testing.T) {
	t.Setenv("DATABASE_URL", pgtemp.NewDB(t))
	opts, err := parseFlags(nil, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = run(context.Background(), opts, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"replayed", "resumed by the recovery worker", "every key took effect once"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if len([]rune(line)) > 100 {
			t.Errorf("line wider than 100 columns: %q", line)
		}
	}
}

// TestFlags checks that the flags the integration tests rely on parse, and that nonsense is
// refused by name.
func TestFlags(t *testing.T) {
	opts, err := parseFlags([]string{"-serve", "-addr", "127.0.0.1:0", "-lease", "2s", "-scan", "1s", "-die-at", "payout:in-charge"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !opts.serve || opts.addr != "127.0.0.1:0" || opts.dieAt != "payout:in-charge" || opts.lease.Seconds() != 2 {
		t.Fatalf("flags parsed wrong: %+v", opts)
	}
	var stderr bytes.Buffer
	if _, err := parseFlags([]string{"-die-at", "nowhere"}, &stderr); err == nil || !strings.Contains(err.Error(), "-die-at") {
		t.Fatalf("an unknown crash point must be refused, got %v", err)
	}
}
