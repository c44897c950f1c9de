package idemcli_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// serveUI starts `idem ui` with args on a free port and returns its URL; the process is stopped
// with SIGTERM when the test ends, and must exit 0.
func (b *testBundle) serveUI(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(b.bin, append([]string{"ui", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+b.url)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = io.Discard
	require.NoError(t, cmd.Start())
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	_, rest, ok := strings.Cut(line, "http://")
	require.True(t, ok, "idem ui says where it serves: %q", line)
	base := "http://" + strings.Fields(rest)[0]
	t.Cleanup(func() {
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, cmd.Wait(), "idem ui exits 0 when stopped")
		stopped = true
	})
	return strings.TrimSuffix(base, "/")
}

func TestCLIUI(t *testing.T) {
	t.Parallel()
	bin := build(t)
	b := setup(t, bin)
	b.ok(t, "migrate")
	// A run, made by an engine of the test's: a run's key stays the run's, whoever serves it.
	wf := workflow.Define("ui-cli", func(ctx context.Context, n int) (int, error) {
		return steps.Tx(ctx, "one", func(ctx context.Context, tx pgx.Tx) (int, error) { return n, nil }, nil)
	})
	e, err := workflow.NewEngine(b.pool, &workflow.Config{Workflows: []workflow.Definition{wf}, Logger: quiet()})
	require.NoError(t, err)
	_, err = wf.Run(b.ctx, e, idem.Key{Scope: "shop:1", ID: "r-1"}, 3, nil)
	require.NoError(t, err)

	t.Run("ReadOnly", func(t *testing.T) {
		base := b.serveUI(t)
		res, err := http.Get(base + "/runs")
		require.NoError(t, err)
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Contains(t, string(body), "r-1")
		require.Contains(t, string(body), "read-only")

		res, err = http.PostForm(base+"/action", url.Values{"action": {"cancel"}, "scope": {"shop:1"}, "id": {"r-1"}, "reason": {"x"}})
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusForbidden, res.StatusCode)
	})

	t.Run("BasicAuth", func(t *testing.T) {
		base := b.serveUI(t, "--basic-auth", "ops:s3cret", "--allow-actions")
		res, err := http.Get(base + "/runs")
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusUnauthorized, res.StatusCode)
		require.Contains(t, res.Header.Get("WWW-Authenticate"), "Basic")

		for pass, want := range map[string]int{"wrong": http.StatusUnauthorized, "s3cret": http.StatusOK} {
			req, err := http.NewRequest(http.MethodGet, base+"/runs", nil)
			require.NoError(t, err)
			req.SetBasicAuth("ops", pass)
			res, err = http.DefaultClient.Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			require.Equal(t, want, res.StatusCode, pass)
			if want == http.StatusOK {
				require.Contains(t, string(body), "actions on")
			}
		}
	})

	t.Run("BadFlags", func(t *testing.T) {
		for _, args := range [][]string{
			{"ui", "--basic-auth", "nocolon"},
			{"ui", "--basic-auth", ":pass"},
			{"ui", "--listen", "nohostport"},
			{"ui", "--listen", "0.0.0.0:0", "--allow-actions"},
		} {
			r := b.idem(t, args...)
			require.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
			require.NotEmpty(t, r.stderr)
		}
		r := b.idem(t, "ui", "--listen", "0.0.0.0:0", "--allow-actions")
		require.Contains(t, r.stderr, "needs --basic-auth")
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer taken.Close()
		r = b.idem(t, "ui", "--listen", taken.Addr().String())
		require.Equal(t, 1, r.code, r.stderr)
		require.Contains(t, r.stderr, "error listening")
	})
}
