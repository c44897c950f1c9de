package pgtemp_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pgtemp"
)

func TestMain(m *testing.M) {
	if os.Getenv(leakChildEnv) != "" {
		os.Exit(leakChild())
	}
	os.Exit(pgtemp.Main(m))
}

// leakChildEnv makes the test binary play a test binary that leaves databases behind the way
// examples do, for TestNothingLeftBehind.
const leakChildEnv = "PGTEMP_LEAK_CHILD"

// leakChild creates databases every way the project's tests and examples do, drops none of
// them itself, and prints their names; Main must drop them all.
func leakChild() int {
	return pgtemp.RunMain(func() int {
		ctx := context.Background()
		var names []string
		// Runnable examples: NewExampleDB, with no cleanup of their own.
		names = append(names, pgtemp.NewExampleDB(), pgtemp.NewExampleDB())
		// Examples with a Server of their own (the workflow and steps packages): one never
		// closed, one closed, neither dropping its database.
		for _, closeIt := range []bool{false, true} {
			srv, err := pgtemp.Start(ctx)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			dbURL, err := srv.CreateDatabase(ctx)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			names = append(names, dbURL)
			if closeIt {
				if err := srv.Close(); err != nil {
					fmt.Fprintln(os.Stderr, err)
					return 1
				}
			}
		}
		for _, n := range names {
			u, _ := url.Parse(n)
			fmt.Println("created", strings.TrimPrefix(u.Path, "/"))
		}
		return 0
	})
}

// TestNothingLeftBehind runs a test binary that creates databases the ways tests and examples
// do, on this test's server, and counts what is left of them once it has exited: nothing.
func TestNothingLeftBehind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := pgtemp.Shared(t)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), leakChildEnv+"=1", "TEST_DATABASE_URL="+srv.URL())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "the child failed: %s", stderr.String())

	var created []string
	for _, line := range strings.Split(string(out), "\n") {
		if name, ok := strings.CutPrefix(line, "created "); ok {
			created = append(created, name)
		}
	}
	require.Len(t, created, 4, "the child should report every database it made:\n%s", out)
	for _, name := range created {
		require.False(t, databaseExists(ctx, t, name), "database %s was left behind", name)
	}
	conn, err := pgx.Connect(ctx, srv.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var left int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname LIKE $1`,
		fmt.Sprintf("pgtemp\\_%d\\_%%", cmd.Process.Pid)).Scan(&left))
	require.Zero(t, left, "databases of the child process are left on the server")
}

// databaseExists asks the shared server's admin database whether name exists.
func databaseExists(ctx context.Context, t *testing.T, name string) bool {
	t.Helper()
	conn, err := pgx.Connect(ctx, pgtemp.Shared(t).URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var exists bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists))
	return exists
}

func dbName(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	return strings.TrimPrefix(u.Path, "/")
}

func TestNewDB(t *testing.T) {
	t.Parallel()

	ctx := context.Background()

	t.Run("ParallelDatabasesAreDistinctEmptyAndWritable", func(t *testing.T) {
		t.Parallel()

		const n = 6
		var mu sync.Mutex
		names := map[string]bool{}
		t.Run("group", func(t *testing.T) {
			for i := range n {
				t.Run("db", func(t *testing.T) {
					t.Parallel()
					pool := pgtemp.NewPool(t)

					var name string
					var tables int
					require.NoError(t, pool.QueryRow(ctx,
						"SELECT current_database(), (SELECT count(*) FROM pg_tables WHERE schemaname = 'public')").Scan(&name, &tables))
					require.Zero(t, tables, "a fresh database has no tables")

					_, err := pool.Exec(ctx, "CREATE TABLE t (v int)")
					require.NoError(t, err)
					_, err = pool.Exec(ctx, "INSERT INTO t VALUES ($1)", i)
					require.NoError(t, err)
					var got int
					require.NoError(t, pool.QueryRow(ctx, "SELECT v FROM t").Scan(&got))
					require.Equal(t, i, got)

					mu.Lock()
					names[name] = true
					mu.Unlock()
				})
			}
		})
		require.Len(t, names, n, "every test gets its own database")
	})

	t.Run("DroppedAfterTest", func(t *testing.T) {
		t.Parallel()

		var dbURL string
		t.Run("inner", func(t *testing.T) {
			pool := pgtemp.NewPool(t)
			dbURL = pgtemp.NewDB(t)
			require.NoError(t, pool.Ping(ctx))
			require.True(t, databaseExists(ctx, t, dbName(t, dbURL)))
		})
		require.False(t, databaseExists(ctx, t, dbName(t, dbURL)))
	})

	t.Run("URLDisablesSSL", func(t *testing.T) {
		t.Parallel()

		u, err := url.Parse(pgtemp.NewDB(t))
		require.NoError(t, err)
		require.Equal(t, "disable", u.Query().Get("sslmode"))
		require.True(t, strings.HasPrefix(strings.TrimPrefix(u.Path, "/"), "pgtemp_"))
	})

	t.Run("PoolSizeDefaultsTo16", func(t *testing.T) {
		t.Parallel()

		require.EqualValues(t, 16, pgtemp.NewPool(t).Config().MaxConns)
	})

	t.Run("DropRefusesForeignDatabases", func(t *testing.T) {
		t.Parallel()

		srv := pgtemp.Shared(t)
		u, err := url.Parse(srv.URL())
		require.NoError(t, err)
		u.Path = "/postgres"
		err = srv.DropDatabase(ctx, u.String())
		require.ErrorContains(t, err, "not created by pgtemp")
	})

	t.Run("SharedIsOneServer", func(t *testing.T) {
		t.Parallel()

		require.Same(t, pgtemp.Shared(t), pgtemp.Shared(t))
	})
}

func TestDockerProbe(t *testing.T) {
	t.Parallel()

	ctx := context.Background()

	// shortSocketPath keeps unix socket paths under the kernel's ~108 byte
	// limit, which t.TempDir's long names can exceed.
	shortSocketPath := func(t *testing.T) string {
		t.Helper()
		dir, err := os.MkdirTemp("", "pgtemp-probe")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		return filepath.Join(dir, "docker.sock")
	}

	t.Run("ThisMachineAnswersQuickly", func(t *testing.T) {
		t.Parallel()

		start := time.Now()
		host, err := pgtemp.ProbeDocker(ctx, pgtemp.DockerCandidates())
		elapsed := time.Since(start)
		t.Logf("docker probe took %v: host=%q err=%v", elapsed, host, err)
		require.Less(t, elapsed, 10*time.Second)
		if err != nil {
			require.ErrorContains(t, err, "no engine answered at")
		}
	})

	t.Run("HangingEngineTimesOut", func(t *testing.T) {
		t.Parallel()

		// Accepts connections and never answers: the case that must not hang.
		sock := shortSocketPath(t)
		ln, err := net.Listen("unix", sock)
		require.NoError(t, err)
		t.Cleanup(func() { ln.Close() })
		go func() {
			var conns []net.Conn
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				conns = append(conns, c)
			}
		}()

		start := time.Now()
		_, err = pgtemp.ProbeDocker(ctx, []string{"unix://" + sock})
		elapsed := time.Since(start)
		require.ErrorContains(t, err, "no answer within")
		require.Less(t, elapsed, 10*time.Second)
	})

	t.Run("AnsweringEngineIsFound", func(t *testing.T) {
		t.Parallel()

		sock := shortSocketPath(t)
		ln, err := net.Listen("unix", sock)
		require.NoError(t, err)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/_ping" {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write([]byte("OK"))
		})}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close() })

		host, err := pgtemp.ProbeDocker(ctx, []string{"unix:///nonexistent/docker.sock", "unix://" + sock})
		require.NoError(t, err)
		require.Equal(t, "unix://"+sock, host)
	})

	t.Run("FailuresNameEachHost", func(t *testing.T) {
		t.Parallel()

		_, err := pgtemp.ProbeDocker(ctx, []string{"unix:///nonexistent/docker.sock", "ssh://user@example.invalid"})
		require.ErrorContains(t, err, "unix:///nonexistent/docker.sock (dial unix /nonexistent/docker.sock: connect: no such file or directory)")
		require.ErrorContains(t, err, `ssh://user@example.invalid (scheme "ssh" is not probed`)
	})
}

func TestSortByVersionDesc(t *testing.T) {
	t.Parallel()

	dirs := []string{"/x/9.6/bin", "/x/16/bin", "/x/weird/bin", "/x/10/bin"}
	pgtemp.SortByVersionDesc(dirs)
	require.Equal(t, []string{"/x/16/bin", "/x/10/bin", "/x/9.6/bin", "/x/weird/bin"}, dirs)
}

// The tests below change the environment, so they cannot be parallel.

func TestStartUsesTestDatabaseURL(t *testing.T) {
	ctx := context.Background()
	shared := pgtemp.Shared(t)
	t.Setenv("TEST_DATABASE_URL", shared.URL())

	srv, err := pgtemp.Start(ctx)
	require.NoError(t, err)
	require.Equal(t, "TEST_DATABASE_URL", srv.Source())
	require.False(t, srv.Owned())
	require.Equal(t, shared.URL(), srv.URL())

	dbURL, err := srv.CreateDatabase(ctx)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, srv.DropDatabase(ctx, dbURL))

	require.ErrorContains(t, srv.Restart(ctx), "only local binaries can restart")

	// Close leaves someone else's server running.
	require.NoError(t, srv.Close())
	require.NoError(t, srv.Close())
	require.NotEmpty(t, pgtemp.NewDB(t))
}

func TestStartAddsSSLModeToTestDatabaseURL(t *testing.T) {
	ctx := context.Background()
	u, err := url.Parse(pgtemp.Shared(t).URL())
	require.NoError(t, err)
	u.RawQuery = ""
	t.Setenv("TEST_DATABASE_URL", u.String())

	srv, err := pgtemp.Start(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	require.Contains(t, srv.URL(), "sslmode=disable")
}

func TestStartRejectsBadTestDatabaseURL(t *testing.T) {
	t.Setenv("TEST_DATABASE_URL", "host=localhost dbname=x")

	_, err := pgtemp.Start(context.Background())
	require.ErrorContains(t, err, "pgtemp: error using TEST_DATABASE_URL: database URL must start with postgres://")
}

func TestStartReportsEverythingTried(t *testing.T) {
	t.Setenv("TEST_DATABASE_URL", "")
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	t.Setenv("PATH", "")
	pgtemp.SetBinGlob(t, "/nonexistent/postgresql/*/bin")

	start := time.Now()
	srv, err := pgtemp.Start(context.Background())
	require.Nil(t, srv)
	require.Less(t, time.Since(start), 10*time.Second)
	t.Log(err)
	msg := err.Error()
	for _, want := range []string{
		"pgtemp: no Postgres: ",
		"TEST_DATABASE_URL not set",
		`docker: not tried, no container source is linked in (a test file with import _ "github.com/idemkit/idem/idemtest/pgdocker" uses a Docker engine)`,
		"local binaries: initdb and postgres not found on PATH, pg_config --bindir (pg_config not found on PATH), /nonexistent/postgresql/*/bin (no match)",
	} {
		require.Contains(t, msg, want)
	}
}

// TestOwnedServerLifecycle starts a second server of its own, so that
// restarting it cannot disturb tests on the shared one.
func TestOwnedServerLifecycle(t *testing.T) {
	ctx := context.Background()

	srv, err := pgtemp.Start(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })

	if srv.Source() != "local binaries" {
		// TEST_DATABASE_URL or a container: neither restarts.
		require.Equal(t, srv.Source() == "testcontainers", srv.Owned())
		require.Error(t, srv.Restart(ctx))
		require.NoError(t, srv.Close())
		return
	}
	require.True(t, srv.Owned())
	require.Contains(t, srv.URL(), "sslmode=disable")

	dbURL, err := srv.CreateDatabase(ctx)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE t (v text)")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "INSERT INTO t VALUES ('kept')")
	require.NoError(t, err)

	var fsync string
	require.NoError(t, conn.QueryRow(ctx, "SHOW fsync").Scan(&fsync))
	require.Equal(t, "off", fsync)
	var maxConns int
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('max_connections')::int").Scan(&maxConns))
	require.Equal(t, 400, maxConns)

	_, oldPID := pgtemp.LocalDirAndPID(srv)
	require.NoError(t, srv.Restart(ctx))
	dir, pid := pgtemp.LocalDirAndPID(srv)
	require.NotEqual(t, oldPID, pid)
	require.False(t, pgtemp.ProcessAlive(oldPID))

	// The old connection died with the old server; the URL still works.
	require.Error(t, conn.Ping(ctx))
	conn, err = pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	var v string
	require.NoError(t, conn.QueryRow(ctx, "SELECT v FROM t").Scan(&v))
	require.Equal(t, "kept", v)
	require.NoError(t, conn.Close(ctx))

	// The admin pool recovered too.
	require.NoError(t, srv.DropDatabase(ctx, dbURL))

	require.NoError(t, srv.Close())
	require.NoError(t, srv.Close())
	require.False(t, pgtemp.ProcessAlive(pid))
	_, err = os.Stat(dir)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.ErrorContains(t, srv.Restart(ctx), "server is closed")
}
