package idem_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/tx"
)

// beginOnly hides the pool's type, so that tx.Run takes the path for any other Beginner (the
// transaction db begins, writes not deferred).
type beginOnly struct{ p *pgxpool.Pool }

func (b beginOnly) Begin(ctx context.Context) (pgx.Tx, error) { return b.p.Begin(ctx) }

// TestTransactionControlInsideFn: whatever fn sends to end the transaction it was given, in
// whatever spelling and through whatever method, the key is never stored without the effect nor
// the effect committed without the key. A statement that would end the transaction is refused
// before it is sent, the attempt fails, and nothing of it commits, whether fn then returns nil or
// an error.
func TestTransactionControlInsideFn(t *testing.T) {
	t.Parallel()
	spellings := []string{
		"ROLLBACK", "rollback", "COMMIT", "END", "ABORT", "ROLLBACK AND CHAIN", "COMMIT AND CHAIN",
		"/* c */ ROLLBACK", "-- c\nCOMMIT", "/* a /* nested */ b */ commit", "\n\t  CoMmIt WORK",
		"SELECT 1; COMMIT", "SELECT ';'; ROLLBACK", "SELECT $$;$$; END", "PREPARE TRANSACTION 'p1'",
	}
	// send is how fn sends the statement: each way a pgx.Tx offers.
	sends := map[string]func(ctx context.Context, t pgx.Tx, sql string) error{
		"Exec": func(ctx context.Context, t pgx.Tx, sql string) error { _, err := t.Exec(ctx, sql); return err },
		"Query": func(ctx context.Context, t pgx.Tx, sql string) error {
			rows, err := t.Query(ctx, sql)
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		},
		"QueryRow": func(ctx context.Context, t pgx.Tx, sql string) error {
			err := t.QueryRow(ctx, sql).Scan()
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		},
		"SendBatch": func(ctx context.Context, t pgx.Tx, sql string) error {
			b := &pgx.Batch{}
			b.Queue(sql)
			return t.SendBatch(ctx, b).Close()
		},
		"Savepoint": func(ctx context.Context, t pgx.Tx, sql string) error {
			sp, err := t.Begin(ctx)
			if err != nil {
				return err
			}
			_, err = sp.Exec(ctx, sql)
			return err
		},
	}
	// paths are the ways fn gets a transaction.
	type call func(ctx context.Context, b *testBundle, k idem.Key, fn func(context.Context, pgx.Tx) (receipt, error)) error
	paths := map[string]call{
		"RunPool": func(ctx context.Context, b *testBundle, k idem.Key, fn func(context.Context, pgx.Tx) (receipt, error)) error {
			_, err := idem.Run(ctx, b.pool, k, fn, idem.MaxAttempts(1))
			return err
		},
		"RunOtherBeginner": func(ctx context.Context, b *testBundle, k idem.Key, fn func(context.Context, pgx.Tx) (receipt, error)) error {
			_, err := idem.Run(ctx, beginOnly{b.pool}, k, fn, idem.MaxAttempts(1))
			return err
		},
		"DoInCallersTx": func(ctx context.Context, b *testBundle, k idem.Key, fn func(context.Context, pgx.Tx) (receipt, error)) error {
			return pgx.BeginFunc(ctx, b.pool, func(t pgx.Tx) error {
				_, err := idem.Do(ctx, t, k, fn)
				return err
			})
		},
		"TxRunAroundDo": func(ctx context.Context, b *testBundle, k idem.Key, fn func(context.Context, pgx.Tx) (receipt, error)) error {
			return tx.Run(ctx, b.pool, func(ctx context.Context, t pgx.Tx) error {
				_, err := idem.Do(ctx, t, k, fn)
				return err
			}, tx.MaxAttempts(1))
		},
	}
	for pathName, path := range paths {
		t.Run(pathName, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			// Commit and Rollback on the transaction fn was given are refused, and leave it whole:
			// what fn does then commits together with its key, or not at all.
			for _, end := range []string{"Commit", "Rollback"} {
				id := "method-" + end
				k := idem.Key{Scope: "tenant-a", ID: id}
				err := path(b.ctx, b, k, func(ctx context.Context, dbtx pgx.Tx) (receipt, error) {
					r, err := recordEffect(id, end, nil)(ctx, dbtx)
					if err != nil {
						return r, err
					}
					if end == "Commit" {
						require.Error(t, dbtx.Commit(ctx))
					} else {
						require.Error(t, dbtx.Rollback(ctx))
					}
					return r, nil
				})
				require.NoError(t, err, end)
				require.Equal(t, 1, b.effects(t, id), end)
				require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_keys WHERE id = $1`, id), end)
			}
			n := 0
			for sendName, send := range sends {
				for _, sql := range spellings {
					for _, fnFails := range []bool{false, true} {
						n++
						id := fmt.Sprintf("k%d", n)
						k := idem.Key{Scope: "tenant-a", ID: id}
						errFn := errors.New("fn failed after sending transaction control")
						err := path(b.ctx, b, k, func(ctx context.Context, t pgx.Tx) (receipt, error) {
							r, err := recordEffect(id, sendName, nil)(ctx, t)
							if err != nil {
								return r, err
							}
							_ = send(ctx, t, sql) // a careless fn ignores the error
							if fnFails {
								return r, errFn
							}
							return r, nil
						})
						what := fmt.Sprintf("%s via %s, fn fails: %v", sql, sendName, fnFails)
						require.Error(t, err, what)
						if fnFails {
							require.ErrorIs(t, err, errFn, what)
						} else {
							require.ErrorIs(t, err, tx.ErrTxControl, what)
						}
						require.Zero(t, b.effects(t, id), "no effect may commit: %s", what)
						require.Zero(t, b.count(t, `SELECT count(*) FROM idem_keys WHERE id = $1`, id), "no key may be stored: %s", what)
					}
				}
			}
			var prepared int
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_prepared_xacts`).Scan(&prepared))
			require.Zero(t, prepared, "no transaction was prepared")
		})
	}
}
