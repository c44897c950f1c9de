package txown

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/txctl"
)

// stubTx stands in for pgx's transaction under ownedTx. It is not a store: the test is about
// ownedTx's own guard, and a call that reaches the stub after the close is the failure.
type stubTx struct {
	pgx.Tx
	mu    sync.Mutex
	calls int
}

func (s *stubTx) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	return pgconn.CommandTag{}, nil
}

// TestOwnedTxCloseRace is the misuse the guard exists for: goroutines that kept the transaction
// Run gave fn keep using it while Run ends it (Close, as Run does when fn returns) on its own
// goroutine. What the guard promises, and the test checks: no data race on it under -race, and
// a call that starts after the close gets pgx.ErrTxClosed and never reaches the connection. (A
// call already past the check when the close comes is not stopped; the guard is a check, not a
// lock.)
func TestOwnedTxCloseRace(t *testing.T) {
	t.Parallel()
	stub := &stubTx{}
	ot := &Tx{real: stub, attempt: &txctl.Attempt{}}
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			<-start
			for {
				_, err := ot.Exec(context.Background(), "SELECT 1")
				if errors.Is(err, pgx.ErrTxClosed) {
					return
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	close(start)
	ot.Close()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Exec: %v", err)
	}
	stub.mu.Lock()
	before := stub.calls
	stub.mu.Unlock()
	if _, err := ot.Exec(context.Background(), "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Exec after the close: got %v, want pgx.ErrTxClosed", err)
	}
	stub.mu.Lock()
	defer stub.mu.Unlock()
	if stub.calls != before {
		t.Fatal("a call after the close reached the connection")
	}
}
