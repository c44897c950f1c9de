package store_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/internal/store"
)

func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }

type testBundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	st   *store.Statements
}

// setup gives each test a database of its own with idem migrated, so that the statements that
// read a whole table (the scans, counts and lists) see only the test's rows.
func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx := context.Background()
	pool := pgtemp.NewPool(t)
	require.NoError(t, idem.Migrate(ctx, pool))
	return &testBundle{ctx: ctx, pool: pool, st: store.For("")}
}

// newToken is a fresh lease token, as the engine makes one.
func newToken() pgtype.UUID { return pgtype.UUID{Bytes: uuid.New(), Valid: true} }

// run is a run's row for a fixture, inserted with its key by insertRun. Zero fields take the
// default named beside them; times are relative to the database's clock.
type run struct {
	scope, id   string
	workflow    string         // "wf"
	state       store.RunState // running
	token       pgtype.UUID    // none unless Valid
	owner       string         // none
	lease       time.Duration  // the lease runs out lease from now (negative: it has); none when 0
	expires     time.Duration  // a finished run expires this long from now (negative: it has); 1h when 0
	attempts    int
	fingerprint []byte
	input       []byte
	output      []byte
	lastError   string
	trace       string
	created     time.Duration  // created_at is this long from now (negative: in the past)
	deadline    *time.Duration // the run's deadline from now; none when nil
	waitSeq     int            // none when 0
	waitName    string         // none when ""
	wakeAt      *time.Duration // from now; none when nil
}

// insertRun writes r's key and run with plain SQL, the way the statements under test would have
// left them.
func (b *testBundle) insertRun(t *testing.T, r run) {
	t.Helper()
	if r.workflow == "" {
		r.workflow = "wf"
	}
	if r.state == "" {
		r.state = store.RunRunning
	}
	var expires *int64
	if r.state.Finished() {
		e := time.Hour.Microseconds()
		if r.expires != 0 {
			e = r.expires.Microseconds()
		}
		expires = &e
	}
	var lease *int64
	if r.lease != 0 {
		l := r.lease.Microseconds()
		lease = &l
	}
	us := func(d *time.Duration) *int64 {
		if d == nil {
			return nil
		}
		v := d.Microseconds()
		return &v
	}
	text := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	var waitSeq *int
	if r.waitSeq != 0 {
		waitSeq = &r.waitSeq
	}
	_, err := b.pool.Exec(b.ctx, `
WITH key AS (
	INSERT INTO idem_keys (scope, id, workflow, created_at, expires_at) VALUES ($1, $2, $3, now(), 'infinity')
)
INSERT INTO idem_runs (scope, id, workflow, state, fingerprint, input, output, last_error, attempts, lease_token, lease_owner,
	lease_expires_at, trace_context, created_at, updated_at, finished_at, expires_at, deadline, wait_seq, wait_name, wake_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
	now() + $12::int8 * interval '1 microsecond', $13, now() + $14::int8 * interval '1 microsecond', now(),
	CASE WHEN $15::int8 IS NOT NULL THEN now() END, now() + $15::int8 * interval '1 microsecond',
	now() + $16::int8 * interval '1 microsecond', $17, $18, now() + $19::int8 * interval '1 microsecond')`,
		r.scope, r.id, r.workflow, string(r.state), r.fingerprint, r.input, r.output, text(r.lastError), r.attempts, r.token,
		text(r.owner), lease, text(r.trace), r.created.Microseconds(), expires, us(r.deadline), waitSeq, text(r.waitName),
		us(r.wakeAt))
	require.NoError(t, err)
}

// insertDoKey writes a key of idem.Do's that expires ttl from now (negative: it has).
func (b *testBundle) insertDoKey(t *testing.T, scope, id string, ttl time.Duration) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO idem_keys (scope, id, fingerprint, result, created_at, expires_at)
VALUES ($1, $2, '\x01', '{"ok":true}', now(), now() + $3::int8 * interval '1 microsecond')`, scope, id, ttl.Microseconds())
	require.NoError(t, err)
}

// insertStep writes a completed step of a run; a non-empty failure makes it a failed one.
func (b *testBundle) insertStep(t *testing.T, scope, id string, seq int, name, failure string) {
	t.Helper()
	var output, errText any
	if failure == "" {
		output = []byte(`"out-` + name + `"`)
	} else {
		errText = failure
	}
	_, err := b.pool.Exec(b.ctx, `INSERT INTO idem_steps (scope, id, seq, name, kind, output, error) VALUES ($1, $2, $3, $4, 'tx', $5, $6)`,
		scope, id, seq, name, output, errText)
	require.NoError(t, err)
}

// insertSignal writes a pending signal to a run's mailbox and returns its seq.
func (b *testBundle) insertSignal(t *testing.T, scope, id, name, payload string) int64 {
	t.Helper()
	var seq int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `INSERT INTO idem_signals (scope, id, name, payload) VALUES ($1, $2, $3, $4) RETURNING seq`,
		scope, id, name, []byte(payload)).Scan(&seq))
	return seq
}

// insertHistory gives a run one row in each of the tables that hold what a run leaves behind:
// a step, a failed attempt, a signal and an event.
func (b *testBundle) insertHistory(t *testing.T, scope, id string) {
	t.Helper()
	b.insertStep(t, scope, id, 1, "one", "")
	b.insertSignal(t, scope, id, "sig", "{}")
	_, err := b.pool.Exec(b.ctx, `
WITH a AS (
	INSERT INTO idem_step_attempts (scope, id, seq, name, kind, attempt, outcome, error) VALUES ($1, $2, 1, 'one', 'tx', 1, 'retried', 'boom')
)
INSERT INTO idem_events (scope, id, name, value) VALUES ($1, $2, 'ev', '1')`, scope, id)
	require.NoError(t, err)
}

// history counts what a run left behind in each table, keyed by table.
func (b *testBundle) history(t *testing.T, scope, id string) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, table := range []string{"idem_keys", "idem_runs", "idem_steps", "idem_step_attempts", "idem_signals", "idem_events"} {
		counts[table] = b.count(t, table, scope, id)
	}
	return counts
}

// count counts the rows of table under a key.
func (b *testBundle) count(t *testing.T, table, scope, id string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+table+` WHERE scope = $1 AND id = $2`, scope, id).Scan(&n))
	return n
}

// stored is a run's row as the database holds it, read with plain SQL to check what a statement
// wrote.
type stored struct {
	State        store.RunState
	Workflow     string
	Output       []byte
	LastError    *string
	Attempts     int
	Token        pgtype.UUID
	Owner        *string
	LeaseLeft    *time.Duration // until the lease runs out; nil for none
	Finished     bool
	ExpiresIn    *time.Duration // until the run expires; nil for none
	WaitSeq      *int
	WaitName     *string
	WakeAt       *int64 // µs
	CreatedUS    int64
	LeaseUS      *int64
	DeadlineUS   *int64
	Fingerprint  []byte
	Input        []byte
	TraceContext *string
}

func (b *testBundle) stored(t *testing.T, scope, id string) stored {
	t.Helper()
	var (
		s              stored
		lease, expires *int64
	)
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT state, workflow, output, last_error, attempts, lease_token, lease_owner,
	(extract(epoch FROM lease_expires_at - now()) * 1000000)::int8, finished_at IS NOT NULL,
	(extract(epoch FROM expires_at - now()) * 1000000)::int8, wait_seq, wait_name, (extract(epoch FROM wake_at) * 1000000)::int8,
	(extract(epoch FROM created_at) * 1000000)::int8, (extract(epoch FROM lease_expires_at) * 1000000)::int8,
	(extract(epoch FROM deadline) * 1000000)::int8, fingerprint, input, trace_context
FROM idem_runs WHERE scope = $1 AND id = $2`, scope, id).Scan(&s.State, &s.Workflow, &s.Output, &s.LastError, &s.Attempts,
		&s.Token, &s.Owner, &lease, &s.Finished, &expires, &s.WaitSeq, &s.WaitName, &s.WakeAt, &s.CreatedUS, &s.LeaseUS,
		&s.DeadlineUS, &s.Fingerprint, &s.Input, &s.TraceContext))
	dur := func(us *int64) *time.Duration {
		if us == nil {
			return nil
		}
		d := time.Duration(*us) * time.Microsecond
		return &d
	}
	s.LeaseLeft, s.ExpiresIn = dur(lease), dur(expires)
	return s
}

// begin starts a transaction that is rolled back when the test ends, if it is still open then.
func (b *testBundle) begin(t *testing.T) pgx.Tx {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// lockedElsewhere begins a transaction that gives up on a lock at once, for a statement that
// must find a row locked (or not) by another transaction without waiting for it.
func (b *testBundle) lockedElsewhere(t *testing.T) pgx.Tx {
	t.Helper()
	tx := b.begin(t)
	_, err := tx.Exec(b.ctx, `SET LOCAL lock_timeout = '50ms'`)
	require.NoError(t, err)
	return tx
}

// requireRunHeld requires another transaction to hold a run's row against a writer: a
// checkpoint's fence (FOR NO KEY UPDATE) would wait for it.
func (b *testBundle) requireRunHeld(t *testing.T, scope, id string) {
	t.Helper()
	_, err := b.lockedElsewhere(t).Exec(b.ctx, `SELECT FROM idem_runs WHERE scope = $1 AND id = $2 FOR NO KEY UPDATE`, scope, id)
	require.True(t, isLockTimeout(err), "%s/%s is not held: %v", scope, id, err)
}

// isLockTimeout reports whether err is a statement that gave up waiting for a lock.
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// within requires d to lie in [lo, hi].
func within(t *testing.T, d, lo, hi time.Duration) {
	t.Helper()
	require.GreaterOrEqual(t, d, lo)
	require.LessOrEqual(t, d, hi)
}

func ptr[T any](v T) *T { return &v }
