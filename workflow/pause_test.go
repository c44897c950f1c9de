//go:build unix

package workflow_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStaleProcessPausedWithSIGSTOP freezes a child process in the middle of a step (its write
// done, not committed) until its lease has expired and this process has taken the run over. The
// step is the run's last: a run exists (and has a lease) once its first step has committed.
// Then the child goes on, as a process back from a long GC pause or a network partition would:
// its step must be refused, its write rolled back, and it must say it lost the lease.
func TestStaleProcessPausedWithSIGSTOP(t *testing.T) {
	t.Parallel()
	b := setup(t)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=pause:in:settle", helperDBEnv+"="+b.url)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() string {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "child exited early")
			return l
		case <-time.After(30 * time.Second):
			t.Fatal("child said nothing")
			return ""
		}
	}
	require.Equal(t, crashMarker, next())
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	b.waitLeaseExpired(t, crashKey)

	freshOwns, releaseFresh := make(chan struct{}), make(chan struct{})
	// The fresh process owns the run once it reaches the charge: its first pass found the key
	// taken at the reserve, looked it up and took the expired lease over.
	var once sync.Once
	fresh := newTransfer(b.pool, &hooks{at: func(_ context.Context, p string) {
		if p == "before:charge" {
			once.Do(func() {
				close(freshOwns)
				<-releaseFresh
			})
		}
	}})
	e := b.engine(t, fastConfig(fresh))
	type result struct {
		r   receipt
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := fresh.Run(b.ctx, e, crashKey, transferReq{Amount: 42, Note: "crash"}, nil)
		done <- result{r, err}
	}()
	<-freshOwns

	_, err = stdin.Write([]byte("go\n"))
	require.NoError(t, err)
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	res := next()
	require.True(t, strings.HasPrefix(res, "RESULT lease-lost=true"), res)
	require.Zero(t, b.count(t, `SELECT count(*) FROM effects WHERE step = 'settle'`), "the paused process's write must roll back")

	close(releaseFresh)
	r := <-done
	require.NoError(t, r.err)
	b.checkTransfer(t, r.r)
}
