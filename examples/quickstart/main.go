// Command quickstart shows idem.Run making a money transfer safe to retry, on the Postgres named by
// DATABASE_URL (its user must be able to create tables). It plays a transfer, its retry, twenty
// concurrent duplicates and a reused key, then checks the ledger against what it claimed.
//
//	DATABASE_URL=postgres://localhost:5432/postgres go run ./examples/quickstart
//
// It imports nothing but idem's public packages, so it can be copied as it is. (go run
// ./examples/bank starts a throwaway Postgres by itself.)
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

type transferReq struct {
	From, To string
	Amount   int64
}

type receipt struct {
	LedgerID int64 `json:"ledger_id"`
	Balance  int64 `json:"balance"`
}

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		return errors.New("DATABASE_URL is not set: point it at a Postgres database where you may create tables, as in DATABASE_URL=postgres://localhost:5432/postgres go run ./examples/quickstart")
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := idem.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS qs_accounts (name text PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0));
		CREATE TABLE IF NOT EXISTS qs_ledger (id bigserial PRIMARY KEY, idem_key text NOT NULL, from_acct text, to_acct text, amount bigint);
		INSERT INTO qs_accounts VALUES ('alice', 1000), ('bob', 1000) ON CONFLICT DO NOTHING;`); err != nil {
		return err
	}

	var executions atomic.Int64
	send := func(key string, req transferReq) (receipt, bool, error) {
		// The ledger row this call's function wrote, if it ran. It may run and be rolled back
		// (a duplicate committed first; the retry then replays that one's answer), so "this
		// call executed" means the answer carries this call's own row.
		var mine int64
		k := idem.Key{Scope: "customer:alice", ID: key,
			Fingerprint: idem.Fingerprint(req.From, req.To, strconv.FormatInt(req.Amount, 10))}
		r, err := idem.Run(ctx, pool, k, func(ctx context.Context, tx pgx.Tx) (receipt, error) {
			var r receipt
			// A slow fraud check, so that concurrent duplicates really overlap.
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.05)`); err != nil {
				return r, err
			}
			if _, err := tx.Exec(ctx, `UPDATE qs_accounts SET balance = balance + $1 WHERE name = $2`, req.Amount, req.To); err != nil {
				return r, err
			}
			if err := tx.QueryRow(ctx, `UPDATE qs_accounts SET balance = balance - $1 WHERE name = $2 RETURNING balance`, req.Amount, req.From).Scan(&r.Balance); err != nil {
				return r, err
			}
			err := tx.QueryRow(ctx, `INSERT INTO qs_ledger (idem_key, from_acct, to_acct, amount) VALUES ($1, $2, $3, $4) RETURNING id`, key, req.From, req.To, req.Amount).Scan(&r.LedgerID)
			mine = r.LedgerID
			return r, err
		})
		executed := err == nil && mine != 0 && r.LedgerID == mine
		if executed {
			executions.Add(1)
		}
		return r, executed, err
	}
	show := func(what, key string, r receipt, executed bool, err error) {
		outcome := "replayed"
		switch {
		case err != nil:
			outcome = "error: " + err.Error()
		case executed:
			outcome = "executed"
		}
		if err == nil {
			outcome += fmt.Sprintf(" -> ledger #%d, alice has %d", r.LedgerID, r.Balance)
		}
		fmt.Printf("%-34s key %s  %s\n", what, key[len(key)-8:], outcome)
	}

	req := transferReq{From: "alice", To: "bob", Amount: 100}
	key := uuid.Must(uuid.NewV7()).String()
	r, executed, err := send(key, req)
	show("transfer 100 alice->bob", key, r, executed, err)
	r, executed, err = send(key, req)
	show("same request, retried", key, r, executed, err)

	dupKey := uuid.Must(uuid.NewV7()).String()
	var wg sync.WaitGroup
	var ran, replayed, inflight atomic.Int64
	start := make(chan struct{})
	for range 20 {
		wg.Go(func() {
			<-start
			for {
				_, executed, err := send(dupKey, transferReq{From: "alice", To: "bob", Amount: 5})
				if errors.Is(err, idem.ErrInFlight) {
					inflight.Add(1)
					time.Sleep(5 * time.Millisecond) // a real client honours RetryAfter
					continue
				}
				if err == nil && executed {
					ran.Add(1)
				} else if err == nil {
					replayed.Add(1)
				}
				return
			}
		})
	}
	close(start)
	wg.Wait()
	fmt.Printf("%-34s key %s  executed %d, replayed %d (%d in-flight answers on the way)\n",
		"20 concurrent duplicates of 5", dupKey[len(dupKey)-8:], ran.Load(), replayed.Load(), inflight.Load())

	_, _, err = send(key, transferReq{From: "alice", To: "bob", Amount: 999})
	show("same key, amount 999", key, receipt{}, false, err)

	var total, ledgerRows, maxPerKey int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT sum(balance) FROM qs_accounts), (SELECT count(*) FROM qs_ledger),
		(SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM qs_ledger GROUP BY idem_key) c)`).Scan(&total, &ledgerRows, &maxPerKey); err != nil {
		return err
	}
	fmt.Printf("\nchecked in Postgres: money %d (was 2000), ledger rows %d, executions %d, most rows for one key %d\n",
		total, ledgerRows, executions.Load(), maxPerKey)
	if total != 2000 || ledgerRows != 2 || maxPerKey != 1 || executions.Load() != 2 {
		return errors.New("an invariant does not hold")
	}
	fmt.Println("every key took effect once; every retry got the same answer")
	return nil
}
