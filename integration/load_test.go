package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemhttp"
)

const (
	numAccounts = 16
	opening     = 100_000
)

// op is one logical request: a key and what is sent under it, the same on every retry.
type op struct {
	path     string // /transfers or /payouts
	customer string
	key      string
	body     []byte
}

// outcome is the final answer a client got for an op.
type outcome struct {
	op
	status   int
	replayed bool
	body     []byte
	err      error
}

// final reports whether the answer is one the bank stored: what every retry must get again. A
// 404 (an account that is not the caller's) is not stored, and the clients here never get one.
func (o *outcome) final() bool {
	switch o.status {
	case http.StatusOK, http.StatusCreated, http.StatusPaymentRequired:
		return o.err == nil
	}
	return false
}

// loadClient sends ops with idemhttp.Transport, as a real client of the bank would.
type loadClient struct {
	base string
	http *http.Client
}

func newLoadClient(base string) *loadClient {
	// The bank may be dead for a second or two at a time (kills, restarts): many quick
	// attempts ride that out, and a bound on each attempt keeps a hung connection from
	// holding a client.
	tr := &http.Transport{MaxIdleConnsPerHost: 64, ResponseHeaderTimeout: 30 * time.Second}
	return &loadClient{base: base, http: &http.Client{Transport: &idemhttp.Transport{
		Base: tr, MaxAttempts: 400, MinBackoff: 20 * time.Millisecond, MaxBackoff: 500 * time.Millisecond,
	}}}
}

func (c *loadClient) do(ctx context.Context, o op) outcome {
	out := outcome{op: o}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+o.path, bytes.NewReader(o.body))
	if err != nil {
		out.err = err
		return out
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Customer", o.customer)
	req.Header.Set("Idempotency-Key", o.key)
	resp, err := c.http.Do(req)
	if err != nil {
		out.err = err
		return out
	}
	defer resp.Body.Close()
	out.status = resp.StatusCode
	out.replayed = resp.Header.Get(idemhttp.DefaultReplayedHeader) == "true"
	out.body, out.err = io.ReadAll(resp.Body)
	return out
}

// openAccounts opens numAccounts accounts, account i owned by customer c<i>.
func openAccounts(t testing.TB, c *loadClient) {
	t.Helper()
	for i := 1; i <= numAccounts; i++ {
		body, _ := json.Marshal(map[string]any{"owner": fmt.Sprintf("c%d", i), "opening": opening})
		o := c.do(context.Background(), op{path: "/accounts", customer: fmt.Sprintf("c%d", i), key: uuid.NewString(), body: body})
		require.NoError(t, o.err)
		require.Equal(t, http.StatusCreated, o.status, string(o.body))
		var acct struct{ ID int64 }
		require.NoError(t, json.Unmarshal(o.body, &acct))
		require.Equal(t, int64(i), acct.ID, "accounts must be numbered 1..n in a fresh database")
	}
}

// randomOp makes a transfer (some of them overdrafts) or, one time in payoutEvery, a payout.
func randomOp(payoutEvery int) op {
	from := rand.IntN(numAccounts) + 1
	o := op{customer: "c" + strconv.Itoa(from), key: uuid.Must(uuid.NewV7()).String()}
	if payoutEvery > 0 && rand.IntN(payoutEvery) == 0 {
		o.path = "/payouts"
		o.body, _ = json.Marshal(map[string]int64{"account": int64(from), "amount": int64(rand.IntN(3000) + 1)})
		return o
	}
	to := rand.IntN(numAccounts-1) + 1
	if to >= from {
		to++
	}
	o.path = "/transfers"
	o.body, _ = json.Marshal(map[string]int64{"from": int64(from), "to": int64(to), "amount": int64(rand.IntN(20_000) + 1)})
	return o
}

// load is a running load: clients send random ops until max ops were sent or stop is called.
type load struct {
	mu       sync.Mutex
	outcomes []outcome
	sent     atomic.Int64
	stopped  atomic.Bool
	wg       sync.WaitGroup
}

// startLoad starts clients that send up to max ops to base.
func startLoad(base string, clients, max, payoutEvery int) *load {
	l := &load{}
	c := newLoadClient(base)
	for range clients {
		l.wg.Go(func() {
			for !l.stopped.Load() && l.sent.Add(1) <= int64(max) {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				o := c.do(ctx, randomOp(payoutEvery))
				cancel()
				l.mu.Lock()
				l.outcomes = append(l.outcomes, o)
				l.mu.Unlock()
			}
		})
	}
	return l
}

// stop asks the clients to send nothing new, and waits for the requests in progress.
func (l *load) stop() []outcome {
	l.stopped.Store(true)
	return l.wait()
}

// wait waits for every client to finish its ops.
func (l *load) wait() []outcome {
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.outcomes
}

// sweep sends every op that got no final answer again, with its key, until it gets one: what a
// client that persists its keys does after an outage. What is still without an answer is lost.
func sweep(t testing.TB, base string, outs []outcome) (resent, lost int) {
	t.Helper()
	c := newLoadClient(base)
	for i := range outs {
		if outs[i].final() {
			continue
		}
		resent++
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		outs[i] = c.do(ctx, outs[i].op)
		cancel()
		if !outs[i].final() {
			lost++
			t.Errorf("op %s %s got no final answer: status %d, err %v, body %s", outs[i].path, outs[i].key, outs[i].status, outs[i].err, outs[i].body)
		}
	}
	return resent, lost
}

// envInt reads a size from the environment, so that CI runs the default and a soak test can
// scale it up.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
