// Package workflowtest tests workflows fast, and checks code changes against stored runs.
//
// A test [Engine] runs workflows with the engine of package workflow itself (the same code that
// runs them in production: the start contract, the history, the retries, the waits) against a
// real Postgres, with a virtual clock and without River. The test moves the clock with
// [Engine.Advance], and every sleep, await timeout, deadline and schedule tick that falls due on
// the way fires, in order, within that call; signals are sent with [Engine.Signal]; the functions of Call steps
// are replaced, by step name, with fakes ([Config.Fakes]). A workflow that sleeps thirty days
// and then awaits a signal for a week is tested in milliseconds:
//
//	func TestReminder(t *testing.T) {
//		ctx := t.Context()
//		te := workflowtest.New(t, &workflowtest.Config{
//			Workflows: []workflow.Definition{Reminder},
//			Fakes: map[string]workflowtest.Fake{
//				"send": func(ctx context.Context, key string) (any, error) { return "sent", nil },
//			},
//		})
//		key := idem.Key{Scope: "customer:7", ID: "reminder-1"}
//		_, err := Reminder.Run(ctx, te.Engine(), key, in, nil)
//		require.ErrorIs(t, err, idem.ErrInFlight) // asleep for 30 days
//		require.NoError(t, te.Advance(ctx, 30*24*time.Hour))
//		require.NoError(t, te.Advance(ctx, 7*24*time.Hour)) // the await's timeout
//		out, err := Reminder.Get(ctx, te.Engine(), key)
//		...
//		steps, err := te.History(ctx, key)
//	}
//
// How: the engine's statements read the time from one place (internal/store's clock seam), which
// in a test engine is Postgres's now() plus an offset kept in a table of the test's database
// (idem_test_clock), and the engine's own checks of time read the same offset. The jobs a
// production engine inserts into River (a wake-up at a sleep's end, the run of a StartTx) are
// kept in another table (idem_test_jobs), in the same transactions, and the test engine runs
// them, through the engine's own wake and resume code, when the clock reaches them. A retry of a
// failed step does not wait out its backoff. Production engines are untouched by all of it: their
// statements' texts are the same, byte for byte.
//
// [Replay] and [ReplayAll] replay stored runs (from Postgres with [LoadRuns], or from the JSON of
// idem runs export with [ReadExport]) against the current code, with the engine's own replay
// logic and no effects, and report every run that would diverge from its history, and where:
// run them in CI before a deploy that changes workflows with runs in progress.
package workflowtest
