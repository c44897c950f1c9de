package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pgtemp"
)

// bankStartTimeout bounds one start of the bank: connecting, migrating, starting River.
const bankStartTimeout = 60 * time.Second

// bankProc is the bank running as a child process. It keeps one address across restarts, so
// clients retrying through a kill find the next process where the last one was.
type bankProc struct {
	t     testing.TB
	dbURL string // the bank's DATABASE_URL (maybe through a fault proxy)
	addr  string
	base  []string // flags for every start

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	logs   *tailBuffer
	kills  int
	starts int
}

// startBank starts the bank against dbURL with short leases and scans, so recovery is quick.
func startBank(t testing.TB, dbURL string, flags ...string) *bankProc {
	t.Helper()
	b := &bankProc{t: t, dbURL: dbURL, addr: freeAddr(t), logs: &tailBuffer{max: 64 << 10},
		base: append([]string{"-serve", "-lease", "1s", "-scan", "1s", "-v"}, flags...)}
	t.Cleanup(func() {
		b.kill()
		if t.Failed() {
			t.Logf("last output of the bank:\n%s", b.logs.String())
		}
	})
	b.start()
	return b
}

// freeAddr finds a port nobody listens on. Another process could take it before the bank
// does; on this machine's loopback that has not been seen.
func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func (b *bankProc) url() string { return "http://" + b.addr }

// start starts a new process with the base flags and extra ones, and waits until it listens.
func (b *bankProc) start(extra ...string) {
	b.t.Helper()
	args := append(append([]string{}, b.base...), "-addr", b.addr)
	args = append(args, extra...)
	cmd := exec.Command(bankBinary, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+b.dbURL)
	stdout, err := cmd.StdoutPipe()
	require.NoError(b.t, err)
	cmd.Stderr = b.logs
	require.NoError(b.t, cmd.Start())
	exited := make(chan struct{})
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(b.logs, line)
			if !signalled && strings.HasPrefix(line, "listening on http://") {
				signalled = true
				close(ready)
			}
		}
		_ = cmd.Wait()
		close(exited)
	}()
	b.mu.Lock()
	b.cmd, b.exited = cmd, exited
	b.starts++
	b.mu.Unlock()
	select {
	case <-ready:
	case <-exited:
		b.t.Fatalf("the bank exited before it listened:\n%s", b.logs.String())
	case <-time.After(bankStartTimeout):
		b.t.Fatalf("the bank did not listen within %s:\n%s", bankStartTimeout, b.logs.String())
	}
}

// kill SIGKILLs the process, if running, and waits for it: no cleanup of any kind happens in
// it, as in a machine that loses power.
func (b *bankProc) kill() {
	b.mu.Lock()
	cmd, exited := b.cmd, b.exited
	b.cmd = nil
	b.mu.Unlock()
	if cmd == nil {
		return
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err == nil {
		b.mu.Lock()
		b.kills++
		b.mu.Unlock()
	}
	<-exited
}

// waitDeath waits for a process that was told to kill itself (-die-at) and reports whether it
// died of SIGKILL.
func (b *bankProc) waitDeath(timeout time.Duration) bool {
	b.t.Helper()
	b.mu.Lock()
	cmd, exited := b.cmd, b.exited
	b.cmd = nil
	b.mu.Unlock()
	select {
	case <-exited:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-exited
		b.t.Fatalf("the bank did not die within %s", timeout)
	}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// tailBuffer keeps the last max bytes written to it, for showing a failed test's logs.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if over := w.buf.Len() - w.max; over > 0 {
		w.buf.Next(over)
	}
	return len(p), nil
}

func (w *tailBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// ownServer starts a Postgres for one test and returns it with a fresh database on it. Tests that
// restart the server, or that flood it with connections, use one, so that the other tests'
// connections never queue behind theirs on the shared server's listen socket. With
// TEST_DATABASE_URL set, that server is the one named.
func ownServer(t testing.TB) (*pgtemp.Server, string) {
	t.Helper()
	ctx := context.Background()
	srv, err := pgtemp.Start(ctx)
	require.NoError(t, err, "the test needs a Postgres of its own")
	t.Cleanup(func() { _ = srv.Close() })
	dbURL, err := srv.CreateDatabase(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.DropDatabase(context.Background(), dbURL) })
	return srv, dbURL
}

// openPool connects the test's own pool, straight to Postgres, for counting. Its connections are
// named, so that the fault injector can leave them alone.
func openPool(t testing.TB, dbURL string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = "idem-test"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// eventually polls cond until it holds or timeout passes: the tests wait for the database to say
// that something happened, never for a fixed time.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		ok, err := cond()
		if ok {
			return
		}
		if err != nil {
			lastErr = err
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
