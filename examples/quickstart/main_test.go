package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/idemkit/idem/idemtest"
)

func TestMain(m *testing.M) { os.Exit(idemtest.Main(m)) }

// TestQuickstart runs the tour end to end: it fails if any invariant it checks in Postgres breaks.
func TestQuickstart(t *testing.T) {
	t.Setenv("DATABASE_URL", idemtest.NewDB(t, nil))
	if err := run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestQuickstartNeedsDatabaseURL checks that the program says what to set rather than failing to
// connect somewhere.
func TestQuickstartNeedsDatabaseURL(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	err := run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL is not set") {
		t.Fatalf("got %v, want an error that asks for DATABASE_URL", err)
	}
}
