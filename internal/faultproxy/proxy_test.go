package faultproxy_test

import (
	"context"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/internal/pgtemp"
)

func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }

type testBundle struct {
	direct  *pgxpool.Pool // straight to Postgres, to check what really landed
	proxied *pgxpool.Pool // through the proxy
	proxy   *faultproxy.Proxy
	url     string // the database through the proxy
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx := context.Background()

	dbURL := pgtemp.NewDB(t)
	proxied, proxy := faultproxy.NewPool(t, dbURL)

	direct, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)

	_, err = direct.Exec(ctx, "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL)")
	require.NoError(t, err)

	return &testBundle{direct: direct, proxied: proxied, proxy: proxy, url: proxy.URL(dbURL)}
}

// connect opens a connection through the proxy, closed when the test ends.
func (b *testBundle) connect(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), b.url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func (b *testBundle) count(t *testing.T, id int) int {
	t.Helper()
	var n int
	err := b.direct.QueryRow(context.Background(), "SELECT count(*) FROM items WHERE id = $1", id).Scan(&n)
	require.NoError(t, err)
	return n
}

func TestProxy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("PassesQueriesThrough", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		conn := bundle.connect(t)

		// Simple protocol, extended protocol with arguments, and a
		// transaction, all through the proxy.
		_, err := conn.Exec(ctx, "INSERT INTO items VALUES (1, 'one')")
		require.NoError(t, err)
		var name string
		require.NoError(t, conn.QueryRow(ctx, "SELECT name FROM items WHERE id = $1", 1).Scan(&name))
		require.Equal(t, "one", name)

		dbtx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = dbtx.Exec(ctx, "INSERT INTO items VALUES ($1, $2)", 2, "two")
		require.NoError(t, err)
		require.NoError(t, dbtx.Commit(ctx))
		require.Equal(t, 1, bundle.count(t, 2))

		stats := bundle.proxy.Stats()
		require.Equal(t, 1, stats.Connections)
		require.Equal(t, 1, stats.Commits)
		require.Zero(t, stats.LostCommitReplies+stats.DroppedCommits)
	})

	t.Run("AnswersSSLRequestWithN", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		// sslmode=prefer makes pgx ask for TLS first; the proxy declines
		// and pgx carries on in plain text.
		u, err := url.Parse(bundle.url)
		require.NoError(t, err)
		q := u.Query()
		q.Set("sslmode", "prefer")
		u.RawQuery = q.Encode()
		conn, err := pgx.Connect(ctx, u.String())
		require.NoError(t, err)
		defer conn.Close(ctx)

		var one int
		require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
		require.Equal(t, 1, one)
	})

	t.Run("LoseNextCommitReply", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		conn := bundle.connect(t)

		dbtx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = dbtx.Exec(ctx, "INSERT INTO items VALUES (1, 'one')")
		require.NoError(t, err)

		bundle.proxy.LoseNextCommitReply()
		require.Error(t, dbtx.Commit(ctx))
		require.True(t, conn.IsClosed(), "the connection should be dead")

		// The proxy waited for the server's reply, so the row is there.
		require.Equal(t, 1, bundle.count(t, 1))
		require.Equal(t, 1, bundle.proxy.Stats().LostCommitReplies)
	})

	t.Run("DropNextCommit", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		conn := bundle.connect(t)

		dbtx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = dbtx.Exec(ctx, "INSERT INTO items VALUES (1, 'one')")
		require.NoError(t, err)

		bundle.proxy.DropNextCommit()
		require.Error(t, dbtx.Commit(ctx))
		require.True(t, conn.IsClosed(), "the connection should be dead")

		require.Equal(t, 0, bundle.count(t, 1))
		require.Equal(t, 1, bundle.proxy.Stats().DroppedCommits)
	})

	t.Run("FaultsApplyToCommitsOnly", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		conn := bundle.connect(t)

		// Statements that merely mention COMMIT are not commits.
		bundle.proxy.DropNextCommit()
		_, err := conn.Exec(ctx, "INSERT INTO items VALUES (1, 'commit')")
		require.NoError(t, err)
		var name string
		require.NoError(t, conn.QueryRow(ctx, "SELECT name FROM items WHERE name = $1", "commit").Scan(&name))
		require.Equal(t, 0, bundle.proxy.Stats().Commits)

		// The fault is still pending and takes the next real COMMIT.
		dbtx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = dbtx.Exec(ctx, "INSERT INTO items VALUES (2, 'two')")
		require.NoError(t, err)
		require.Error(t, dbtx.Commit(ctx))
		require.Equal(t, 0, bundle.count(t, 2))
	})

	t.Run("LoseCommitReplyInBatch", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		conn := bundle.connect(t)

		// In a batch, pgx prepares each statement (Parse) and runs it
		// later (Bind, Execute) in one pipeline with a single Sync: the
		// proxy follows the COMMIT from Parse to Execute.
		batch := &pgx.Batch{}
		batch.Queue("BEGIN")
		batch.Queue("INSERT INTO items VALUES ($1, $2)", 1, "one")
		batch.Queue("COMMIT")

		bundle.proxy.LoseNextCommitReply()
		require.Error(t, conn.SendBatch(ctx, batch).Close())
		require.True(t, conn.IsClosed(), "the connection should be dead")
		require.Equal(t, 1, bundle.count(t, 1))

		stats := bundle.proxy.Stats()
		require.Equal(t, 1, stats.Commits)
		require.Equal(t, 1, stats.LostCommitReplies)
	})

	t.Run("DropCommitInBatch", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		conn := bundle.connect(t)

		batch := &pgx.Batch{}
		batch.Queue("BEGIN")
		batch.Queue("INSERT INTO items VALUES ($1, $2)", 1, "one")
		batch.Queue("COMMIT")

		bundle.proxy.DropNextCommit()
		require.Error(t, conn.SendBatch(ctx, batch).Close())
		require.Equal(t, 0, bundle.count(t, 1))
		require.Equal(t, 1, bundle.proxy.Stats().DroppedCommits)
	})

	t.Run("OneFaultPerCommit", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		bundle.proxy.LoseNextCommitReply()
		insert := func(id int) error {
			conn := bundle.connect(t)
			dbtx, err := conn.Begin(ctx)
			require.NoError(t, err)
			_, err = dbtx.Exec(ctx, "INSERT INTO items VALUES ($1, 'x')", id)
			require.NoError(t, err)
			return dbtx.Commit(ctx)
		}
		require.Error(t, insert(1))
		require.NoError(t, insert(2))
		require.Equal(t, 1, bundle.count(t, 1))
		require.Equal(t, 1, bundle.count(t, 2))

		stats := bundle.proxy.Stats()
		require.Equal(t, 2, stats.Connections)
		require.Equal(t, 2, stats.Commits)
		require.Equal(t, 1, stats.LostCommitReplies)
	})

	t.Run("ResetAll", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		conn1 := bundle.connect(t)
		conn2 := bundle.connect(t)
		for _, conn := range []*pgx.Conn{conn1, conn2} {
			_, err := conn.Exec(ctx, "SELECT 1")
			require.NoError(t, err)
		}

		bundle.proxy.ResetAll()
		for _, conn := range []*pgx.Conn{conn1, conn2} {
			_, err := conn.Exec(ctx, "SELECT 1")
			require.Error(t, err)
		}
		require.Equal(t, 2, bundle.proxy.Stats().Resets)

		// New connections still work.
		_, err := bundle.connect(t).Exec(ctx, "SELECT 1")
		require.NoError(t, err)
	})
}

func TestURL(t *testing.T) {
	t.Parallel()

	proxy, err := faultproxy.New("db.example:5432")
	require.NoError(t, err)
	defer proxy.Close()

	require.Equal(t, "postgres://u:p@"+proxy.Addr()+"/db?sslmode=disable",
		proxy.URL("postgres://u:p@db.example:5432/db?sslmode=disable"))

	cfg, err := pgx.ParseConfig(proxy.URL("host=db.example port=5432 user=u dbname=db"))
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", cfg.Host)
	require.Equal(t, proxy.Addr(), "127.0.0.1:"+strconv.Itoa(int(cfg.Port)))
}

// TestNewPool checks the helper other packages' tests build their proxied pools with: it must
// keep the user and password of the URL it is given (a server that asks for one would refuse a
// copy without it), and its pool must work through the proxy and be cut by it.
func TestNewPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtemp.NewDB(t)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	if _, set := u.User.Password(); !set {
		// Trust-authenticated servers take any password; this one makes sure it is passed on.
		u.User = url.UserPassword(u.User.Username(), "s3cret")
	}
	pool, proxy := faultproxy.NewPool(t, u.String())
	want, _ := u.User.Password()
	require.Equal(t, u.User.Username(), pool.Config().ConnConfig.User)
	require.Equal(t, want, pool.Config().ConnConfig.Password)
	require.Equal(t, proxy.Addr(), pool.Config().ConnConfig.Host+":"+strconv.Itoa(int(pool.Config().ConnConfig.Port)))

	var db string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_database()").Scan(&db))
	require.Equal(t, strings.TrimPrefix(u.Path, "/"), db)
	require.Equal(t, 1, proxy.Stats().Connections)

	proxy.ResetAll()
	require.Equal(t, 1, proxy.Stats().Resets, "the pool's connection must go through the proxy")
}

func TestNew(t *testing.T) {
	t.Parallel()

	_, err := faultproxy.New("no-port")
	require.ErrorContains(t, err, "target must be host:port")
}
