package faultproxy

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// NewPool starts a Proxy in front of the server of dbURL and returns a pool that reaches
// dbURL's database through it, with dbURL's user, password and parameters. The pool is closed
// and the proxy stopped when the test ends; a failure to start either fails the test.
//
//	func TestLostCommit(t *testing.T) {
//		dbURL := pgtemp.NewDB(t)
//		pool, proxy := faultproxy.NewPool(t, dbURL)
//		proxy.LoseNextCommitReply()
//		...
//	}
//
// dbURL is a postgres:// URL or a keyword/value connection string, such as a pool's
// pool.Config().ConnString(), which keeps the password that Config().ConnConfig's fields would
// have to be put back together with.
func NewPool(tb testing.TB, dbURL string) (*pgxpool.Pool, *Proxy) {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		tb.Fatalf("faultproxy: error parsing the database URL: %v", err)
	}
	proxy, err := New(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	if err != nil {
		tb.Fatalf("faultproxy: error starting the proxy: %v", err)
	}
	tb.Cleanup(func() { _ = proxy.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, proxy.URL(dbURL))
	if err != nil {
		tb.Fatalf("faultproxy: error opening a pool through the proxy: %v", err)
	}
	// Registered after the proxy's Close, so it runs first.
	tb.Cleanup(pool.Close)
	return pool, proxy
}
