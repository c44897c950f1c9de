package idemcli_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

// hostile are strings a client or a workflow's code can get stored, written to take over the
// operator's terminal: a title change, a screen clear, colours, a carriage return that hides
// what came before, a right-to-left override that reverses what follows, a C1 control (CSI).
const (
	hostileName  = "payout\x1b]0;owned\x07"
	hostileScope = "merchant:\u202e7"
	hostileError = "\x1b[2J\x1b[31mcard declined\r\nall good\u0085\u009b31m"
)

// requireTerminalSafe checks that out has no byte a terminal acts on: no C0 control but the
// line feeds between lines, no DEL, no C1 control, no bidirectional override.
func requireTerminalSafe(t *testing.T, out string) {
	t.Helper()
	for i, r := range out {
		switch {
		case r == '\n':
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0), r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			t.Fatalf("unescaped %U at offset %d of:\n%s", r, i, out)
		}
	}
}

// TestTerminalOutput: what idem prints in tables escapes the control characters of stored
// strings (a workflow's name, a scope, error texts) and clips long ones, while --json keeps them
// whole; fingerprints are hex in tables and in --json; a sleep's stored wake-up is shown as a time
// and a duration.
func TestTerminalOutput(t *testing.T) {
	t.Parallel()
	bin := build(t)
	b := bundle(t, bin, idemtest.NewDB(t, &idemtest.Opts{River: true}))
	longError := hostileError + strings.Repeat(" and then some", 40)

	wf := workflow.Define(hostileName, func(ctx context.Context, in int) (string, error) {
		if in == 2 {
			if err := steps.Sleep(ctx, "cool-off", 90*time.Minute); err != nil {
				return "", err
			}
		}
		return steps.Call(ctx, "charge\x1b[8m", func(ctx context.Context, key string) (string, error) {
			return "", steps.Permanent(errors.New(longError))
		}, nil)
	})
	e, err := workflow.NewEngine(b.pool, &workflow.Config{Workflows: []workflow.Definition{wf}, Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	client, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{Logger: quiet()}) // inserts the sleep's wake job only
	require.NoError(t, err)
	e.SetClient(client)

	key := idem.Key{Scope: hostileScope, ID: "payout-1"}
	_, err = wf.Run(b.ctx, e, key, 1, nil)
	require.ErrorIs(t, err, workflow.ErrFailed)
	sleeping := idem.Key{Scope: hostileScope, ID: "payout-2"}
	_, err = wf.Run(b.ctx, e, sleeping, 2, nil)
	require.ErrorIs(t, err, idem.ErrInFlight, "the run sleeps")

	t.Run("RunsList", func(t *testing.T) {
		out := b.ok(t, "runs", "list")
		requireTerminalSafe(t, out)
		require.Contains(t, out, `merchant:\u202e7`)
		require.Contains(t, out, `payout\x1b]0;owned\x07`)
		require.Contains(t, out, `\x1b[2J\x1b[31mcard declined`)
		for _, line := range strings.Split(out, "\n") {
			require.LessOrEqual(t, len([]rune(line)), 400, "a table line is clipped: %q", line)
		}
		var page workflow.RunListResult
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "runs", "list", "--json")), &page))
		require.Len(t, page.Runs, 2)
		require.Equal(t, hostileName, page.Runs[1].Workflow, "--json has the stored strings whole")
		require.Equal(t, hostileScope, page.Runs[1].Scope)
		require.Contains(t, page.Runs[1].Error, longError)
	})

	t.Run("RunsShow", func(t *testing.T) {
		out := b.ok(t, "runs", "show", hostileScope, "payout-1")
		requireTerminalSafe(t, out)
		require.Contains(t, out, `charge\x1b[8m`)
		require.Contains(t, out, `\x1b[2J\x1b[31mcard declined\r\nall good\u0085\u009b31m`)
		require.NotContains(t, out, "and then some and then some and then some and then some and then some and then some and then some and then some and then some",
			"every error text is clipped in the table")
		var run workflow.RunRow
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "runs", "show", "--json", hostileScope, "payout-1")), &run))
		require.Contains(t, run.Error, longError)
		require.Equal(t, longError, run.Failures[0].Error)
	})

	t.Run("SleepShownAsTime", func(t *testing.T) {
		out := b.ok(t, "runs", "show", hostileScope, "payout-2")
		requireTerminalSafe(t, out)
		var run workflow.RunRow
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "runs", "show", "--json", hostileScope, "payout-2")), &run))
		require.Equal(t, workflow.RunStateSleeping, run.State)
		require.Len(t, run.Steps, 1)
		wake := run.WakeAt.UTC().Format(time.RFC3339)
		require.Regexp(t, `(?m)^1\s+cool-off\s+sleep\s+1\s+\S+\s+until `+regexp.QuoteMeta(wake)+` \(1h30m0s after the step\)$`, out)
		require.NotContains(t, out, string(run.Steps[0].Output), "not the stored µs")
	})

	t.Run("Keys", func(t *testing.T) {
		fp := idem.Fingerprint("book")
		_, err := idem.Run(b.ctx, b.pool, idem.Key{Scope: hostileScope, ID: "order-1", Fingerprint: fp},
			func(context.Context, pgx.Tx) (string, error) { return "receipt", nil })
		require.NoError(t, err)

		out := b.ok(t, "keys", "get", hostileScope, "order-1")
		requireTerminalSafe(t, out)
		require.Regexp(t, `(?m)^fingerprint\s+`+hex.EncodeToString(fp)+`$`, out)
		require.Regexp(t, `(?m)^hash\s+`+redact.Hash(hostileScope, "order-1")+`$`, out, "the hash that stands for the key in spans and logs")
		var info map[string]any
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, "keys", "get", "--json", hostileScope, "order-1")), &info))
		require.Equal(t, hex.EncodeToString(fp), info["fingerprint"], "the same encoding in --json as in the table")
		require.Equal(t, hostileScope, info["scope"])

		out = b.ok(t, "keys", "list", "--scope", hostileScope)
		requireTerminalSafe(t, out)
		require.Regexp(t, `(?m)^order-1\s+\S+\s+\S+\s+9 bytes\s+`+hex.EncodeToString(fp)+`$`, out)
		require.Regexp(t, `(?m)^payout-1\s+\S+\s+with its run\s+-\s+-\s+run of payout\\x1b]0;owned\\x07 \(failed\)$`, out)
	})
}

// TestKeysList: idem keys list pages through a scope's keys with a cursor, filters them by
// prefix, and refuses a cursor it did not print.
func TestKeysList(t *testing.T) {
	t.Parallel()
	b := setup(t, build(t))
	b.ok(t, "migrate")
	for _, id := range []string{"order-1", "order-2", "order-3", "refund-1"} {
		_, err := idem.Run(b.ctx, b.pool, idem.Key{Scope: "customer:42", ID: id}, func(context.Context, pgx.Tx) (int, error) { return 1, nil })
		require.NoError(t, err)
	}
	_, err := idem.Run(b.ctx, b.pool, idem.Key{Scope: "customer:43", ID: "order-9"}, func(context.Context, pgx.Tx) (int, error) { return 1, nil })
	require.NoError(t, err)

	out := b.ok(t, "keys", "list", "--scope", "customer:42")
	require.Regexp(t, `(?m)^ID\s+CREATED\s+EXPIRES\s+RESULT\s+FINGERPRINT$`, out)
	require.Equal(t, 5, strings.Count(out, "\n"), out)
	require.NotContains(t, out, "order-9")
	require.NotContains(t, out, "more:")

	out = b.ok(t, "keys", "list", "--scope", "customer:42", "--prefix", "order-", "--limit", "2")
	require.Contains(t, out, "order-1")
	require.Contains(t, out, "order-2")
	require.NotContains(t, out, "order-3")
	m := regexp.MustCompile(`(?m)^more: --after (\S+)$`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	out = b.ok(t, "keys", "list", "--scope", "customer:42", "--prefix", "order-", "--limit", "2", "--after", m[1])
	require.Contains(t, out, "order-3")
	require.NotContains(t, out, "refund-1")
	require.NotContains(t, out, "more:")

	var page idem.KeyListResult
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "keys", "list", "--scope", "customer:42", "--json", "--limit", "3")), &page))
	require.Len(t, page.Keys, 3)
	require.NotEmpty(t, page.Next)

	for _, args := range [][]string{
		{"keys", "list"}, {"keys", "list", "--scope", "customer:42", "--after", "garbage"},
		{"keys", "list", "--scope", "customer:43", "--after", page.Next}, {"keys", "list", "--scope", "customer:42", "--limit", "0"},
		{"keys", "list", "--scope", "customer:42", "--prefix", "has space"},
	} {
		r := b.idem(t, args...)
		require.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
		require.Contains(t, r.stderr, "idem keys list: ")
	}
}
