package idemhttp_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemhttp"
)

type receiptArgs struct {
	Order string `json:"order"`
}

func (receiptArgs) Kind() string { return "send_receipt" }

// TestRiverOutbox inserts a River job with InsertTx on the transaction from idemhttp.Tx: the job
// exists exactly when the response was stored, once however often the request is retried.
func TestRiverOutbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	driver := riverpgxv5.New(b.pool)
	migrator, err := rivermigrate.New(driver, nil)
	require.NoError(t, err)
	_, err = migrator.Migrate(b.ctx, rivermigrate.DirectionUp, nil)
	require.NoError(t, err)
	// An insert-only client: no queues, no workers.
	client, err := river.NewClient(driver, &river.Config{})
	require.NoError(t, err)

	fail := true
	h := b.middleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dbtx, ok := idemhttp.Tx(r.Context())
		require.True(t, ok)
		res, err := client.InsertTx(r.Context(), dbtx, receiptArgs{Order: "A-1"}, nil)
		require.NoError(t, err)
		if fail {
			http.Error(w, "payment provider timed out", http.StatusGatewayTimeout)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(map[string]int64{"job": res.Job.ID})
	}))

	jobs := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM river_job WHERE kind = 'send_receipt'`).Scan(&n))
		return n
	}
	require.Equal(t, http.StatusGatewayTimeout, serve(h, request("POST", "/orders", "k1", "")).Code)
	require.Zero(t, jobs()) // rolled back with the 5xx

	fail = false
	first := serve(h, request("POST", "/orders", "k1", ""))
	require.Equal(t, http.StatusAccepted, first.Code)
	replay := serve(h, request("POST", "/orders", "k1", ""))
	require.Equal(t, "true", replay.Header().Get("Idempotent-Replayed"))
	require.Equal(t, first.Body.String(), replay.Body.String())
	require.Equal(t, 1, jobs())
}
