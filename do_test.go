package idem_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/tx"
)

func TestDo(t *testing.T) {
	t.Parallel()

	key := func(id string) idem.Key { return idem.Key{Scope: "tenant-a", ID: id} }

	// do runs Do for k in a transaction of its own and commits it.
	do := func(t *testing.T, b *testBundle, k idem.Key, note string, ran *int, opts ...idem.Option) (receipt, error) {
		t.Helper()
		var out receipt
		err := b.inTx(t, pgx.TxOptions{}, func(tx pgx.Tx) error {
			var err error
			out, err = idem.Do(b.ctx, tx, k, recordEffect(k.Scope+"/"+k.ID, note, ran), opts...)
			return err
		})
		return out, err
	}

	t.Run("FirstRunStoresAndRetriesReplay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ran := 0
		first, err := do(t, b, key("k1"), "first", &ran)
		require.NoError(t, err)
		require.NotZero(t, first.EffectID)
		for range 3 {
			again, err := do(t, b, key("k1"), "second", &ran)
			require.NoError(t, err)
			require.Equal(t, first, again)
		}
		require.Equal(t, 1, ran)
		require.Equal(t, 1, b.effects(t, "tenant-a/k1"))
	})

	t.Run("ScopesAreIsolated", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ran := 0
		a, err := do(t, b, idem.Key{Scope: "alice", ID: "same"}, "alice", &ran)
		require.NoError(t, err)
		c, err := do(t, b, idem.Key{Scope: "bob", ID: "same"}, "bob", &ran)
		require.NoError(t, err)
		require.Equal(t, 2, ran)
		require.NotEqual(t, a.EffectID, c.EffectID)
		require.Equal(t, "bob", c.Note)
	})

	t.Run("MismatchIsRejectedAndRunsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ran := 0
		k := key("k1")
		k.Fingerprint = idem.Fingerprint("amount", "100")
		_, err := do(t, b, k, "first", &ran)
		require.NoError(t, err)

		k.Fingerprint = idem.Fingerprint("amount", "200")
		_, err = do(t, b, k, "second", &ran)
		require.ErrorIs(t, err, idem.ErrMismatch)
		require.Equal(t, 1, ran)
		require.Equal(t, 1, b.effects(t, "tenant-a/k1"))

		// A nil fingerprint means "do not check", so it replays.
		k.Fingerprint = nil
		out, err := do(t, b, k, "third", &ran)
		require.NoError(t, err)
		require.Equal(t, "first", out.Note)
		require.Equal(t, 1, ran)
	})

	t.Run("ErrorFromFnStoresNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		boom := errors.New("card declined by the network")
		err := b.inTx(t, pgx.TxOptions{}, func(t pgx.Tx) error {
			_, err := idem.Do(b.ctx, t, key("k1"), func(context.Context, pgx.Tx) (int, error) { return 0, boom })
			return err
		})
		require.ErrorIs(t, err, boom)
		ran := 0
		_, err = do(t, b, key("k1"), "retry", &ran)
		require.NoError(t, err)
		require.Equal(t, 1, ran)
	})

	t.Run("RollbackFreesTheKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ran := 0
		t1, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		_, err = idem.Do(b.ctx, t1, key("k1"), recordEffect("tenant-a/k1", "rolled back", &ran))
		require.NoError(t, err)
		require.NoError(t, t1.Rollback(b.ctx))

		out, err := do(t, b, key("k1"), "kept", &ran)
		require.NoError(t, err)
		require.Equal(t, "kept", out.Note)
		require.Equal(t, 2, ran)
		require.Equal(t, 1, b.effects(t, "tenant-a/k1"))
	})

	t.Run("ExpiredKeyRunsAgain", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ran := 0
		_, err := do(t, b, key("k1"), "old", &ran, idem.TTL(time.Hour))
		require.NoError(t, err)
		_, err = b.pool.Exec(b.ctx, `UPDATE idem_keys SET expires_at = now() - interval '1 second'`)
		require.NoError(t, err)

		out, err := do(t, b, key("k1"), "new", &ran)
		require.NoError(t, err)
		require.Equal(t, "new", out.Note)
		require.Equal(t, 2, ran)

		// The replaced key is live again for the default TTL.
		var left time.Duration
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (extract(epoch FROM expires_at - now()) * 1e6)::int8 * 1000 FROM idem_keys`).Scan(&left))
		require.InDelta(t, idem.DefaultTTL.Seconds(), left.Seconds(), 60)
		again, err := do(t, b, key("k1"), "newer", &ran)
		require.NoError(t, err)
		require.Equal(t, "new", again.Note)
		require.Equal(t, 2, ran)
	})

	t.Run("InFlightAnswersAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		holder, release := holdKey(t, b, key("k1"))

		ran := 0
		started := time.Now()
		_, err := do(t, b, key("k1"), "dup", &ran)
		require.ErrorIs(t, err, idem.ErrInFlight)
		var inflight *idem.InFlightError
		require.ErrorAs(t, err, &inflight)
		require.GreaterOrEqual(t, inflight.RetryAfter, time.Second)
		require.False(t, inflight.Race)
		require.False(t, tx.IsRetryable(err), "an ordinary in-flight error is the caller's to wait on")
		require.Less(t, time.Since(started), 5*time.Second, "an in-flight duplicate must not wait on a lock")
		require.Equal(t, 0, ran)

		release(true)
		require.NoError(t, <-holder)
		out, err := do(t, b, key("k1"), "dup", &ran)
		require.NoError(t, err)
		require.Equal(t, "holder", out.Note)
		require.Equal(t, 0, ran)
	})

	t.Run("WaitReplaysWhenTheHolderCommits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		holder, release := holdKey(t, b, key("k1"))

		ran := 0
		waiter := make(chan error, 1)
		var out receipt
		go func() {
			var err error
			out, err = do(t, b, key("k1"), "waiter", &ran, idem.Wait(30*time.Second))
			waiter <- err
		}()
		waitForWaiter(t, b)
		release(true)
		require.NoError(t, <-holder)
		require.NoError(t, <-waiter)
		require.Equal(t, "holder", out.Note)
		require.Equal(t, 0, ran)
		require.Equal(t, 1, b.effects(t, "tenant-a/k1"))
	})

	t.Run("WaitRunsWhenTheHolderRollsBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		holder, release := holdKey(t, b, key("k1"))

		ran := 0
		waiter := make(chan error, 1)
		var out receipt
		go func() {
			var err error
			out, err = do(t, b, key("k1"), "waiter", &ran, idem.Wait(30*time.Second))
			waiter <- err
		}()
		waitForWaiter(t, b)
		release(false)
		require.Error(t, <-holder)
		require.NoError(t, <-waiter)
		require.Equal(t, "waiter", out.Note)
		require.Equal(t, 1, ran)
		require.Equal(t, 1, b.effects(t, "tenant-a/k1"))
	})

	t.Run("WaitGivesUpAfterItsBound", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		holder, release := holdKey(t, b, key("k1"))
		ran := 0
		_, err := do(t, b, key("k1"), "waiter", &ran, idem.Wait(50*time.Millisecond))
		require.ErrorIs(t, err, idem.ErrInFlight)
		require.Equal(t, 0, ran)
		release(true)
		require.NoError(t, <-holder)
	})

	t.Run("InvalidKeysAreRejectedBeforeSQL", func(t *testing.T) {
		t.Parallel()
		for name, k := range map[string]idem.Key{
			"EmptyID":      {Scope: "s", ID: ""},
			"EmptyScope":   {Scope: "", ID: "k"},
			"TooLong":      {Scope: "s", ID: strings.Repeat("k", 256)},
			"LongScope":    {Scope: strings.Repeat("s", 256), ID: "k"},
			"Space":        {Scope: "s", ID: "a b"},
			"NonASCII":     {Scope: "s", ID: "caf\u00e9"},
			"ControlByte":  {Scope: "s", ID: "a\x01b"},
			"Tab":          {Scope: "s", ID: "a\tb"},
			"DEL":          {Scope: "s", ID: "a\x7fb"},
			"NUL":          {Scope: "s", ID: "a\x00b"},
			"ScopeControl": {Scope: "s\nt", ID: "k"},
			"ScopeBadUTF8": {Scope: "s\xff", ID: "k"},
		} {
			ran := 0
			_, err := idem.Do(context.Background(), noSQL{t}, k, recordEffect("x", "x", &ran))
			require.ErrorIs(t, err, idem.ErrInvalidKey, name)
			var ik *idem.InvalidKeyError
			require.ErrorAs(t, err, &ik, name)
			require.NotEmpty(t, ik.Reason, name)
			require.Equal(t, 0, ran, name)
		}
		// The longest valid ID is accepted.
		require.NoError(t, idem.Key{Scope: "s", ID: strings.Repeat("~", 255)}.Validate())
	})

	t.Run("BadOptionsAreRejectedBeforeSQL", func(t *testing.T) {
		t.Parallel()
		for _, opt := range []idem.Option{idem.TTL(time.Millisecond), idem.Wait(-time.Second), idem.RetryAfter(0), idem.Schema(strings.Repeat("x", 64))} {
			_, err := idem.Do(context.Background(), noSQL{t}, key("k"), recordEffect("x", "x", nil), opt)
			require.Error(t, err)
			require.Contains(t, err.Error(), "cannot")
		}
	})

	t.Run("ResultRoundTripsThroughJSON", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		type result struct {
			Amount  int64             `json:"amount"`
			Labels  map[string]string `json:"labels"`
			Nothing *int              `json:"nothing"`
			Bytes   []byte            `json:"bytes"`
		}
		want := result{Amount: 42, Labels: map[string]string{"x": "y"}, Bytes: []byte{0, 1, 255}}
		get := func() result {
			var out result
			require.NoError(t, b.inTx(t, pgx.TxOptions{}, func(t pgx.Tx) error {
				var err error
				out, err = idem.Do(b.ctx, t, key("k1"), func(context.Context, pgx.Tx) (result, error) { return want, nil })
				return err
			}))
			return out
		}
		require.Equal(t, want, get())
		require.Equal(t, want, get())
	})

	// The write after fn must fail, never overwrite, when another transaction committed the key
	// after this one looked it up. These races are staged inside fn, so they are deterministic.
	t.Run("RacingCommitAbortsTheLateWriter", func(t *testing.T) {
		t.Parallel()
		for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
			t.Run(string(iso), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				ran := 0
				err := b.inTx(t, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
					_, err := idem.Do(b.ctx, tx, key("k1"), func(ctx context.Context, tx pgx.Tx) (receipt, error) {
						// Bypasses the advisory lock, as only a racer that looked before us could.
						_, err := b.pool.Exec(ctx, `INSERT INTO idem_keys (scope, id, result, expires_at) VALUES ('tenant-a', 'k1', '{"note":"racer"}', now() + interval '1 hour')`)
						require.NoError(t, err)
						return recordEffect("tenant-a/k1", "late", &ran)(ctx, tx)
					})
					return err
				})
				require.Error(t, err)
				require.True(t, tx.IsRetryable(err), "a lost race must be retryable: %v", err)
				require.Equal(t, 0, b.effects(t, "tenant-a/k1"), "the late writer's effect must not commit")

				out, err := do(t, b, key("k1"), "retry", &ran)
				require.NoError(t, err)
				require.Equal(t, "racer", out.Note)
			})
		}
	})

	t.Run("RacingRenewalOfExpiredKeyAbortsTheLateWriter", func(t *testing.T) {
		t.Parallel()
		for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
			t.Run(string(iso), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				_, err := b.pool.Exec(b.ctx, `INSERT INTO idem_keys (scope, id, result, expires_at) VALUES ('tenant-a', 'k1', '{"note":"expired"}', now() - interval '1 hour')`)
				require.NoError(t, err)
				err = b.inTx(t, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
					_, err := idem.Do(b.ctx, tx, key("k1"), func(ctx context.Context, tx pgx.Tx) (receipt, error) {
						_, err := b.pool.Exec(ctx, `UPDATE idem_keys SET result = '{"note":"racer"}', expires_at = now() + interval '1 hour'`)
						require.NoError(t, err)
						return recordEffect("tenant-a/k1", "late", nil)(ctx, tx)
					})
					return err
				})
				require.Error(t, err)
				require.True(t, tx.IsRetryable(err), "a lost race must be retryable: %v", err)
				require.Equal(t, 0, b.effects(t, "tenant-a/k1"))
				out, err := do(t, b, key("k1"), "retry", nil)
				require.NoError(t, err)
				require.Equal(t, "racer", out.Note)
			})
		}
	})

	t.Run("ExpiredKeyReapedMeanwhileIsTaken", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.pool.Exec(b.ctx, `INSERT INTO idem_keys (scope, id, result, expires_at) VALUES ('tenant-a', 'k1', '{"note":"expired"}', now() - interval '1 hour')`)
		require.NoError(t, err)
		out, err := do(t, b, key("k1"), "fresh", nil)
		require.NoError(t, err)
		require.Equal(t, "fresh", out.Note)

		_, err = b.pool.Exec(b.ctx, `UPDATE idem_keys SET expires_at = now() - interval '1 hour'`)
		require.NoError(t, err)
		err = b.inTx(t, pgx.TxOptions{}, func(tx pgx.Tx) error {
			out, err = idem.Do(b.ctx, tx, key("k1"), func(ctx context.Context, tx pgx.Tx) (receipt, error) {
				_, err := b.pool.Exec(ctx, `DELETE FROM idem_keys`) // the reaper, racing
				require.NoError(t, err)
				return recordEffect("tenant-a/k1", "after reap", nil)(ctx, tx)
			})
			return err
		})
		require.NoError(t, err)
		require.Equal(t, "after reap", out.Note)
		require.Equal(t, 2, b.effects(t, "tenant-a/k1"))
	})

	t.Run("EachIsolationLevel", func(t *testing.T) {
		t.Parallel()
		for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
			t.Run(string(iso), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				ran := 0
				var outs []receipt
				for range 3 {
					var out receipt
					err := tx.Run(b.ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
						var err error
						out, err = idem.Do(ctx, t, key("k1"), recordEffect("tenant-a/k1", "x", &ran))
						return err
					}, tx.Isolation(iso))
					require.NoError(t, err)
					outs = append(outs, out)
				}
				require.Equal(t, 1, ran)
				require.Equal(t, outs[0], outs[1])
				require.Equal(t, outs[0], outs[2])
				require.Equal(t, 1, b.effects(t, "tenant-a/k1"))
			})
		}
	})

	t.Run("CustomSchema", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		opt := idem.Schema("billing idem")
		require.NoError(t, idem.Migrate(b.ctx, b.pool, opt))
		ran := 0
		_, err := do(t, b, key("k1"), "x", &ran, opt)
		require.NoError(t, err)
		_, err = do(t, b, key("k1"), "x", &ran, opt)
		require.NoError(t, err)
		require.Equal(t, 1, ran)
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM "billing idem".idem_keys`).Scan(&n))
		require.Equal(t, 1, n)
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM public.idem_keys`).Scan(&n))
		require.Equal(t, 0, n, "a key in one schema is not stored in another")
		// The same key in the default schema is another key.
		_, err = do(t, b, key("k1"), "x", &ran)
		require.NoError(t, err)
		require.Equal(t, 2, ran)
	})

	t.Run("KeyOfAWorkflowIsAMismatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, run := range []struct {
			id, state, expires string
		}{
			{"running", "running", "NULL"},
			{"done", "done", "now() + interval '1 hour'"},
			{"failed", "failed", "now() + interval '1 hour'"},
		} {
			b.seedRun(t, "tenant-a", run.id, "payout", run.state, run.expires)
			ran := 0
			start := time.Now()
			_, err := do(t, b, key(run.id), "x", &ran)
			require.ErrorIs(t, err, idem.ErrMismatch, run.id)
			require.Contains(t, err.Error(), `workflow "payout"`, "the error names the owner")
			require.Equal(t, 0, ran)
			require.Less(t, time.Since(start), 5*time.Second, "refused at once, never a wait")
		}
	})
}

// holdKey starts a transaction that runs Do for k and stays inside fn until release is called;
// release(true) lets fn return and commits, release(false) rolls back. The returned channel
// receives the transaction's outcome. When the key does not get held (Do fails, or does not
// call fn) the test fails instead of waiting for ever.
func holdKey(t *testing.T, b *testBundle, k idem.Key) (<-chan error, func(commit bool)) {
	t.Helper()
	entered := make(chan struct{})
	proceed := make(chan bool, 1)
	done := make(chan error, 1)
	go func() {
		done <- b.inTx(t, pgx.TxOptions{}, func(tx pgx.Tx) error {
			_, err := idem.Do(b.ctx, tx, k, func(ctx context.Context, tx pgx.Tx) (receipt, error) {
				r, err := recordEffect(k.Scope+"/"+k.ID, "holder", nil)(ctx, tx)
				close(entered)
				if !<-proceed {
					return r, errors.New("holder rolled back")
				}
				return r, err
			})
			return err
		})
	}()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("holdKey: the holder's transaction ended before it held key %q: %v", k.ID, err)
	case <-time.After(holdTimeout):
		t.Fatalf("holdKey: key %q was not held within %s", k.ID, holdTimeout)
	}
	return done, func(commit bool) { proceed <- commit }
}

// holdTimeout bounds how long holdKey waits for its holder to get the key: a guard against a
// hang, not a timing the tests rely on.
const holdTimeout = 30 * time.Second

// waitForWaiter blocks until some other session has polled for a key lock at least once more
// than the holder did, which shows that a waiting Do is inside its wait loop.
func waitForWaiter(t *testing.T, b *testBundle) {
	t.Helper()
	// The waiter's connection shows the lookup's text once the statement is prepared, before it
	// has run: seen idle in its transaction with that text a second time, at a later
	// query_start, it has run the lookup at least once and found the key in flight.
	deadline := time.Now().Add(30 * time.Second)
	var first *time.Time
	for time.Now().Before(deadline) {
		var started []time.Time
		rows, err := b.pool.Query(b.ctx, `SELECT query_start FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()
			AND state = 'idle in transaction' AND query LIKE '%pg_try_advisory_xact_lock%'`)
		require.NoError(t, err)
		started, err = pgx.CollectRows(rows, pgx.RowTo[time.Time])
		require.NoError(t, err)
		for _, at := range started {
			switch {
			case first == nil:
				first = &at
			case at.After(*first):
				return
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("no waiter showed up")
}

// noSQL is a pgx.Tx that fails the test on any use: Do must reject bad input before SQL.
type noSQL struct{ t *testing.T }

func (n noSQL) fail()                                 { n.t.Helper(); n.t.Fatal("Do sent SQL for input it should have rejected") }
func (n noSQL) Begin(context.Context) (pgx.Tx, error) { n.fail(); return nil, nil }
func (n noSQL) Commit(context.Context) error          { n.fail(); return nil }
func (n noSQL) Rollback(context.Context) error        { n.fail(); return nil }
func (n noSQL) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	n.fail()
	return 0, nil
}
func (n noSQL) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults { n.fail(); return nil }
func (n noSQL) LargeObjects() pgx.LargeObjects                         { n.fail(); return pgx.LargeObjects{} }
func (n noSQL) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	n.fail()
	return nil, nil
}
func (n noSQL) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	n.fail()
	return pgconn.CommandTag{}, nil
}
func (n noSQL) Query(context.Context, string, ...any) (pgx.Rows, error) { n.fail(); return nil, nil }
func (n noSQL) QueryRow(context.Context, string, ...any) pgx.Row        { n.fail(); return nil }
func (n noSQL) Conn() *pgx.Conn                                         { n.fail(); return nil }

func TestDoReusesExpiredWorkflowKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seedRun(t, "s", "k1", "payout", "done", "now() - interval '1 second'")
	ran := 0
	err := b.inTx(t, pgx.TxOptions{}, func(tx pgx.Tx) error {
		_, err := idem.Do(b.ctx, tx, idem.Key{Scope: "s", ID: "k1"}, recordEffect("k1", "new", &ran))
		return err
	})
	require.NoError(t, err)
	require.Equal(t, 1, ran)
	var workflow *string
	var stepsLeft int
	var runsLeft int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT workflow, (SELECT count(*) FROM idem_steps), (SELECT count(*) FROM idem_runs) FROM idem_keys`).Scan(&workflow, &stepsLeft, &runsLeft))
	require.Nil(t, workflow)
	require.Zero(t, stepsLeft, "the expired run's history is gone with it")
	require.Zero(t, runsLeft, "and so is the run")
}

// TestMissingTablesSayWhatToDo: on a database where idem's tables were never created, Do and
// Run say to run Migrate (or apply schema.sql), instead of a driver's "relation does not exist"
// dressed as a failed BEGIN.
func TestMissingTablesSayWhatToDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtemp.NewPool(t)
	k := idem.Key{Scope: "s", ID: "k"}
	fn := func(context.Context, pgx.Tx) (int, error) { return 1, nil }
	_, err := idem.Run(ctx, pool, k, fn)
	require.ErrorContains(t, err, "run idem.Migrate")
	require.ErrorContains(t, err, "schema.sql")
	require.NotContains(t, err.Error(), "beginning transaction")
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := idem.Do(ctx, tx, k, fn); return err })
	require.ErrorContains(t, err, "run idem.Migrate")
	_, err = idem.Run(ctx, pool, k, fn, idem.Schema("elsewhere"))
	require.ErrorContains(t, err, "Schema option", "the message points at the schema too")
}
