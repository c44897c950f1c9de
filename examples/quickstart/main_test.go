package main

import (
	"context"
	"os"
	"testing"

	"github.com/idemkit/idem/internal/pgtemp"
)

func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }

// TestQuickstart runs the tour end to end: it fails if any invariant it checks in Postgres breaks.
func TestQuickstart(t *testing.T) {
	t.Setenv("DATABASE_URL", pgtemp.NewDB(t))
	if err := run(context.Background()); err != nil {
		t.Fatal(err)
	}
}
