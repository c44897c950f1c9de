package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/pgtemp"
)

func TestMain(m *testing.M) { os.Exit(pgtemp.Main(m)) }

// TestDemo plays the README's first command end to end against a pgtemp database: it fails if
// any claim the demo makes, or any invariant it checks in Postgres, does not hold.
func TestDemo(t *testing.T) {
	t.Setenv("DATABASE_URL", pgtemp.NewDB(t))
	opts, err := parseFlags(nil, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = run(context.Background(), opts, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"replayed", "resumed by the recovery worker", "in the ledger, once each  ok", "every key took effect once"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if len([]rune(line)) > 100 {
			t.Errorf("line wider than 100 columns: %q", line)
		}
	}
}

// TestFlags checks that the flags the integration tests rely on parse, and that nonsense is
// refused by name.
func TestFlags(t *testing.T) {
	opts, err := parseFlags([]string{"-serve", "-addr", "127.0.0.1:0", "-lease", "2s", "-scan", "1s", "-die-at", "payout:in-charge"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !opts.serve || opts.addr != "127.0.0.1:0" || opts.dieAt != "payout:in-charge" || opts.lease.Seconds() != 2 {
		t.Fatalf("flags parsed wrong: %+v", opts)
	}
	var stderr bytes.Buffer
	if _, err := parseFlags([]string{"-die-at", "nowhere"}, &stderr); err == nil || !strings.Contains(err.Error(), "-die-at") {
		t.Fatalf("an unknown crash point must be refused, got %v", err)
	}
}

// startBank starts the bank on a fresh database, stopped when the test ends.
func startBank(t *testing.T) *app {
	t.Helper()
	ctx := context.Background()
	pool, err := openPool(ctx, pgtemp.NewDB(t), 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	opts, err := parseFlags([]string{"-addr", "127.0.0.1:0"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	a, err := start(ctx, pool, opts, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.stop)
	return a
}

// TestCurlLines sends the requests -serve prints, as curl would, and checks each answer: the
// lines are what people try first, and what they copy.
func TestCurlLines(t *testing.T) {
	a := startBank(t)
	want := []struct {
		status   int
		replayed bool
	}{
		{201, false}, {201, false}, // two accounts
		{201, false}, // a transfer
		{201, true},  // the same transfer as equivalent JSON: replayed
		{422, false}, // the key for another amount
		{404, false}, // bob, from alice's account
		{200, false}, // a payout
		{200, false}, // alice's account
	}
	reqs := parseCurls(t, curlLines(a.url))
	if len(reqs) != len(want) {
		t.Fatalf("%d curl lines, want %d", len(reqs), len(want))
	}
	for i, req := range reqs {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		replayed := resp.Header.Get("Idempotent-Replayed") == "true"
		if resp.StatusCode != want[i].status || replayed != want[i].replayed {
			t.Errorf("curl line %d (%s %s): got %d replayed=%v, want %d replayed=%v: %s",
				i+1, req.Method, req.URL.Path, resp.StatusCode, replayed, want[i].status, want[i].replayed, body)
		}
	}
	// Bob's refusal did nothing and stored nothing.
	var balance, stored int64
	if err := a.pool.QueryRow(t.Context(), `SELECT balance FROM bank_accounts WHERE id = 1`).Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if err := a.pool.QueryRow(t.Context(), `SELECT count(*) FROM idem_keys WHERE scope = 'customer:bob' AND id = 't-2'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if balance != 900 || stored != 0 {
		t.Errorf("after bob's attempt alice has %d (want 900) and %d answers are stored under his key (want 0)", balance, stored)
	}
	// The last line's view: bob's payout is listed, and the view refuses to act.
	view := strings.Fields(curlLines(a.url)[strings.LastIndex(curlLines(a.url), "http://"):])[0]
	resp, err := http.Get(view)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "p-1") || !strings.Contains(string(body), "read-only") {
		t.Errorf("GET %s: %d, want 200 listing p-1, read-only: %s", view, resp.StatusCode, body)
	}
	resp, err = http.PostForm(a.url+opsPrefix+"/action", url.Values{"action": {"cancel"}, "scope": {"customer:bob"}, "id": {"p-1"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST %s/action: %d, want 403", opsPrefix, resp.StatusCode)
	}
}

// parseCurls turns the curl lines of the -serve tour into requests.
func parseCurls(t *testing.T, text string) []*http.Request {
	t.Helper()
	var reqs []*http.Request
	joined := strings.ReplaceAll(text, "\\\n", " ")
	for _, line := range strings.Split(joined, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "curl ") {
			continue
		}
		method, target, body := "GET", "", ""
		header := http.Header{}
		args := shellWords(t, line)[1:]
		for i := 0; i < len(args); i++ {
			switch arg := args[i]; {
			case arg == "-s" || arg == "-si":
			case strings.HasPrefix(arg, "-X"):
				method = strings.TrimPrefix(arg, "-X")
			case arg == "-H":
				i++
				k, v, _ := strings.Cut(args[i], ":")
				header.Add(k, strings.TrimSpace(v))
			case arg == "-d":
				i++
				body = args[i]
				if method == "GET" {
					method = "POST"
				}
			case strings.HasPrefix(arg, "http"):
				target = arg
			default:
				t.Fatalf("unknown curl argument %q in %q", arg, line)
			}
		}
		req, err := http.NewRequest(method, target, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" && header.Get("Content-Type") == "" {
			header.Set("Content-Type", "application/x-www-form-urlencoded") // what curl -d sends
		}
		req.Header = header
		reqs = append(reqs, req)
	}
	return reqs
}

// shellWords splits a command line with single quotes, as the tour writes it.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("unbalanced quote in %q", line)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// TestStoredPayoutFailureIs4xx fails a payout for good and checks its answer, first and
// replayed: a final answer must not be a 5xx, which generic clients retry without end.
func TestStoredPayoutFailureIs4xx(t *testing.T) {
	a := startBank(t)
	c := newDemoClient(a.url, io.Discard)
	bob := c.openAccount(t.Context(), "bob", 1000)
	a.crash.arm("payout:after-reserve", func(context.Context, string) error {
		return errors.New("refused by the risk check")
	})
	first := c.send(t.Context(), c.once, "POST", "/payouts", "bob", "po-1", map[string]int64{"account": bob, "amount": 10})
	again := c.send(t.Context(), c.once, "POST", "/payouts", "bob", "po-1", map[string]int64{"account": bob, "amount": 10})
	if first.status != http.StatusUnprocessableEntity || again.status != http.StatusUnprocessableEntity {
		t.Fatalf("a failed payout answered %d, then %d; want 422 both times", first.status, again.status)
	}
	if !again.replayed || !bytes.Equal(first.body, again.body) {
		t.Fatalf("the retry must replay the first answer: replayed=%v\n%s\n%s", again.replayed, first.body, again.body)
	}
}

// TestUnavailableHasRetryAfter checks that every 503 says when to come back.
func TestUnavailableHasRetryAfter(t *testing.T) {
	pool, err := openPool(t.Context(), pgtemp.NewDB(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	pool.Close() // every query now fails
	a := &app{pool: pool}
	for _, h := range []http.HandlerFunc{a.getAccount, a.createAccount} {
		r := httptest.NewRequest("POST", "/accounts/1", strings.NewReader(`{"opening":1}`))
		r.SetPathValue("id", "1")
		r.Header.Set("X-Customer", "alice")
		w := httptest.NewRecorder()
		h(w, r)
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
			t.Errorf("got %d with Retry-After %q; want 503 with a Retry-After", w.Code, w.Header().Get("Retry-After"))
		}
	}
	w := httptest.NewRecorder()
	dbError(w)
	if w.Header().Get("Retry-After") == "" {
		t.Error("dbError's 503 has no Retry-After")
	}
}

// TestCLILines checks the cmd/idem lines -serve prints: the throwaway database's URL is spelled
// out, a DATABASE_URL the user set (which may hold a password) is not.
func TestCLILines(t *testing.T) {
	t.Parallel()
	lines := cliLines("postgres://u@h/db", false)
	if !strings.Contains(lines, "DATABASE_URL='postgres://u@h/db' go run ./cmd/idem runs list") {
		t.Errorf("throwaway database: %s", lines)
	}
	lines = cliLines("postgres://u:secret@h/db", true)
	if strings.Contains(lines, "secret") || !strings.Contains(lines, "  go run ./cmd/idem runs show customer:bob p-1") {
		t.Errorf("DATABASE_URL set: %s", lines)
	}
}
