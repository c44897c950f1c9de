package workflow_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/workflow"
)

// The crash tests re-execute the test binary as a child process (TestMain sees helperEnv and
// runs runHelper instead of the tests). The child runs the transfer workflow up to a point,
// says so on stdout and waits there; the parent kills it with SIGKILL, so nothing in the child
// gets to clean up: no deferred function, no rollback, no lease release. The parent then
// recovers the run through River, as a surviving process of the application would.
const (
	helperEnv   = "IDEM_WORKFLOW_CRASH_POINT"
	helperDBEnv = "IDEM_WORKFLOW_CRASH_DB"
	crashMarker = "REACHED-CRASH-POINT"
)

var crashKey = idem.Key{Scope: "merchant:7", ID: "crash-1"}

func runHelper() int {
	point := os.Getenv(helperEnv)
	switch point {
	case sleepPoint:
		return runSleepHelper()
	case leaderPoint:
		return runLeaderHelper()
	case childrenPoint:
		return runChildrenHelper()
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(helperDBEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// "pause:<point>" waits at the point for a line on stdin instead of for death: the parent
	// stops the process with SIGSTOP meanwhile, and lets it go on once its lease is gone.
	pause := strings.HasPrefix(point, "pause:")
	point = strings.TrimPrefix(point, "pause:")
	wf := newTransfer(pool, &hooks{at: func(_ context.Context, p string) {
		if p == point {
			fmt.Println(crashMarker)
			if !pause {
				select {} // wait here for SIGKILL
			}
			_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		}
	}})
	e, err := workflow.NewEngine(pool, fastConfig(wf))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	_, err = wf.Run(ctx, e, crashKey, transferReq{Amount: 42, Note: "crash"}, nil)
	if pause {
		fmt.Printf("RESULT lease-lost=%v: %v\n", errors.Is(err, workflow.ErrLeaseLost), err)
		return 0
	}
	fmt.Fprintf(os.Stderr, "the run ended without reaching %s: %v\n", point, err)
	return 3
}

func TestCrashWithSIGKILL(t *testing.T) {
	t.Parallel()

	for _, point := range []string{"in:reserve", "before:charge", "in:charge", "in:settle", "end"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			b := setup(t)

			killChildAt(t, b, point)

			wf := newTransfer(b.pool, nil)
			e := b.engine(t, fastConfig(wf))
			if beforeFirstCommit[point] {
				// Killed before the run's first step committed: the backend rolled the step
				// (and the run's row) back when the connection went, and the retry starts over.
				b.requireNoRun(t, crashKey)
				// The killed process's backend may hold the key's lock for a moment longer,
				// until it notices its client is gone: the retry waits for it, as clients do.
				r, err := wf.Run(b.ctx, e, crashKey, transferReq{Amount: 42, Note: "crash"}, &workflow.RunOpts{Wait: 10 * time.Second})
				require.NoError(t, err)
				b.checkTransfer(t, r)
				return
			}
			state, _ := b.state(t, crashKey)
			require.Equal(t, "running", state)

			b.startRiver(t, e)
			require.Equal(t, "done", b.waitFinished(t, crashKey))

			r, err := wf.Run(b.ctx, e, crashKey, transferReq{Amount: 42, Note: "crash"}, nil)
			require.NoError(t, err)
			require.Equal(t, 42, r.Amount)
			b.checkTransfer(t, r)
			_, attempts := b.state(t, crashKey)
			require.Equal(t, 2, attempts)
		})
	}
}

// killChildAt re-executes the test binary as a helper process that runs a workflow on b's
// database up to point, where it prints crashMarker, and kills it there with SIGKILL: the
// process dies as a real one does, with no deferred function, no rollback sent, no goodbye.
func killChildAt(t *testing.T, b *testBundle, point string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+point, helperDBEnv+"="+b.url)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	reached := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == crashMarker {
				reached <- true
				return
			}
		}
		close(reached)
	}()
	select {
	case ok := <-reached:
		require.True(t, ok, "child exited before reaching %s", point)
	case <-time.After(30 * time.Second):
		t.Fatalf("child did not reach %s", point)
	}
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
}
