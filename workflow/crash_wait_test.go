package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/workflow"
)

// sleepPoint makes the crash helper start a sleeper run, which suspends, and then wait for
// SIGKILL: the process that put the run to sleep dies, and another must wake it.
const sleepPoint = "sleep"

var sleepKey = idem.Key{Scope: "merchant:7", ID: "sleep-1"}

func runSleepHelper() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(helperDBEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	wf := newSleeper()
	e, err := workflow.NewEngine(pool, fastConfig(wf))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// A client that inserts the wake job but is never started: this process works no job.
	workers := river.NewWorkers()
	if err := e.AddWorkers(workers); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Workers: workers, Logger: quietLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	e.SetClient(client)
	_, err = wf.Run(ctx, e, sleepKey, 1500, nil)
	if !errors.Is(err, idem.ErrInFlight) {
		fmt.Fprintf(os.Stderr, "the run did not suspend: %v\n", err)
		return 3
	}
	fmt.Println(crashMarker)
	select {} // wait here for SIGKILL
}

func TestSleepAcrossSIGKILL(t *testing.T) {
	t.Parallel()

	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprintf("ComeBackAfterTheWakeUp=%v", late), func(t *testing.T) {
			t.Parallel()
			b := setup(t)

			killChildAt(t, b, sleepPoint)

			state, _ := b.state(t, sleepKey)
			require.Equal(t, "sleeping", state)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'idem_workflow_wake' AND state IN ('scheduled', 'available')`))
			if late {
				// Nobody is there when the sleep ends: the run passes straight through later.
				eventually(t, 10*time.Second, "the wake-up time to pass", func() bool {
					return b.count(t, `SELECT count(*) FROM idem_runs WHERE wake_at <= now()`) == 1
				})
			}

			wf := newSleeper()
			e := b.engine(t, fastConfig(wf))
			b.startRiver(t, e)
			out, err := runUntilDone(t, b, wf, e, sleepKey, 1500)
			require.NoError(t, err)
			require.Equal(t, "rested", out)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE step = 'before'`))
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE step = 'after'`))
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_runs WHERE finished_at >= created_at + interval '1500 milliseconds'`))
		})
	}
}
