package pgdocker_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemtest"
	_ "github.com/idemkit/idem/idemtest/pgdocker"
	"github.com/idemkit/idem/internal/pgtemp"
)

func TestMain(m *testing.M) { os.Exit(idemtest.Main(m)) }

// TestNoEngine: with the container source linked in, a machine without a Docker engine is found
// out within the probe's bound, said so, and the next source is tried. (The container itself is
// started on machines with Docker, where idemtest's tests use it.)
func TestNoEngine(t *testing.T) {
	t.Setenv("TEST_DATABASE_URL", "")
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	began := time.Now()
	srv, err := pgtemp.Start(context.Background())
	took := time.Since(began)
	if err == nil {
		t.Cleanup(func() { _ = srv.Close() })
		require.Equal(t, "local binaries", srv.Source())
	} else {
		require.ErrorContains(t, err, "local binaries: ")
	}
	// The docker attempt is in what the server, or the error, says was tried.
	tried := ""
	if err != nil {
		tried = err.Error()
	} else {
		tried = strings.Join(srv.Tried(), "; ")
	}
	require.Contains(t, tried, "docker: no engine answered at unix:///nonexistent/docker.sock")
	t.Logf("found no engine and went on in %s", took)
}

// TestPool: idemtest works with it imported, whatever the machine offers.
func TestPool(t *testing.T) {
	t.Parallel()
	pool := idemtest.NewPool(t, nil)
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM idem_keys`).Scan(&n))
	require.Zero(t, n)
}
