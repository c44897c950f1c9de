package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/store"
)

// ErrNotFound means there is no such key or run: it was never stored, it was deleted, or the
// reaper removed it after it expired. [KeyGet], [KeyDelete] and the workflow engine's read and
// admin operations return it, wrapped in an error that names the key.
//
//	info, err := idem.KeyGet(ctx, pool, key)
//	if errors.Is(err, idem.ErrNotFound) { ... } // 404
var ErrNotFound = errors.New("idem: not found")

// KeyInfo is what is stored under a key, as [KeyGet] reads it. The stored result itself is not
// in it: it may hold what only the client should see, and its size is what an operator needs.
//
//	info, err := idem.KeyGet(ctx, pool, key)
//	fmt.Printf("%s/%s: %d bytes, expires %s\n", info.Scope, info.ID, info.ResultSize, info.Expires)
type KeyInfo struct {
	Scope       string     `json:"scope"`
	ID          string     `json:"id"`
	Fingerprint []byte     `json:"fingerprint,omitempty"` // the request's digest, as stored; nil if none
	Created     time.Time  `json:"created"`
	Expires     *time.Time `json:"expires,omitempty"` // nil for a run's key: the run decides
	Expired     bool       `json:"expired"`           // past Expires: the next Do runs afresh
	ResultSize  int        `json:"result_size"`       // bytes of Do's stored result (JSON)

	// Workflow is the workflow whose run the key belongs to, "" for a key of Do's. RunState is
	// that run's state ("running", "done", ...), "" when the key has no run row.
	Workflow string `json:"workflow,omitempty"`
	RunState string `json:"run_state,omitempty"`
}

// KeyGet reads what is stored under key, without side effects: no lock is taken, nothing is
// written, and an expired key is reported as such rather than deleted. key.Fingerprint is
// ignored. A key that is not stored is [ErrNotFound]; a key that is in flight for the first time
// is not stored yet either. The [Schema] option names the schema, as for [Do].
//
//	info, err := idem.KeyGet(ctx, pool, idem.Key{Scope: "customer:42", ID: "order-7f3a"})
//	switch {
//	case errors.Is(err, idem.ErrNotFound):
//		// never stored, or reaped
//	case err == nil && info.Workflow != "":
//		// a workflow run's key: see workflow.Engine.RunGet
//	}
func KeyGet(ctx context.Context, db Querier, key Key, opts ...Option) (*KeyInfo, error) {
	if db == nil {
		return nil, errors.New("idem: KeyGet needs a database; db is nil")
	}
	cfg, err := adminConfig(key, opts)
	if err != nil {
		return nil, err
	}
	k, ok, err := store.For(cfg.schema).KeyGet(ctx, db, key.Scope, key.ID)
	switch {
	case err != nil:
		return nil, lookupError(cfg, err)
	case !ok:
		return nil, notFound(key)
	}
	return keyInfo(k), nil
}

// keyInfo makes a KeyInfo of a key as stored.
func keyInfo(k store.KeyRecord) *KeyInfo {
	info := &KeyInfo{Scope: k.Scope, ID: k.ID, Fingerprint: k.Fingerprint, Created: k.Created, Expires: k.Expires,
		Expired: !k.Live, ResultSize: k.ResultSize} // expired by the database's clock, as Do decides
	if k.Workflow != nil {
		info.Workflow = *k.Workflow
	}
	if k.RunState != nil {
		info.RunState = string(*k.RunState)
	}
	return info
}

// KeyDelete forgets the result stored under a key of Do's, so that the next Do with it runs
// afresh: for when the stored answer turned out to be wrong and the client must be able to try
// again. It works in one transaction of its own, which takes the key's in-flight lock without
// waiting, as Do does, and so:
//
//   - A Do working on the key right now (for the first time, or replacing an expired result):
//     [ErrInFlight], and nothing is deleted; try again once it has committed.
//   - A key that belongs to a workflow run: refused (cancel the run with the engine's
//     RunCancel instead; a run's key goes with the run when it expires).
//   - No such key: [ErrNotFound].
//
// db is a *pgxpool.Pool or *pgx.Conn (it begins the transaction), or an open pgx.Tx, in which
// case the deletion commits with it. The [Schema] option names the schema, as for [Do].
//
//	err := idem.KeyDelete(ctx, pool, idem.Key{Scope: "customer:42", ID: "order-7f3a"})
//	if errors.Is(err, idem.ErrInFlight) { ... } // a Do holds it; try again in a moment
func KeyDelete(ctx context.Context, db Beginner, key Key, opts ...Option) error {
	if db == nil {
		return errors.New("idem: KeyDelete needs a database; db is nil")
	}
	cfg, err := adminConfig(key, opts)
	if err != nil {
		return err
	}
	st := store.For(cfg.schema)
	return pgx.BeginFunc(ctx, db, func(t pgx.Tx) error {
		locked, err := st.KeyTryLock(ctx, t, lockID(cfg.schema, key))
		if err != nil {
			return lookupError(cfg, err)
		}
		if !locked {
			return &InFlightError{Scope: key.Scope, ID: key.ID, RetryAfter: cfg.retryAfter}
		}
		deleted, err := st.KeyDelete(ctx, t, key.Scope, key.ID)
		switch {
		case err != nil:
			return lookupError(cfg, err)
		case deleted:
			return nil
		}
		workflow, found, err := st.KeyWorkflow(ctx, t, key.Scope, key.ID)
		switch {
		case err != nil:
			return fmt.Errorf("idem: error reading key: %w", err)
		case !found:
			return notFound(key)
		}
		return fmt.Errorf("idem: key %q in scope %q belongs to a run of workflow %q and cannot be deleted; cancel the run with Engine.RunCancel (idem runs cancel), and it goes with its key when it expires", key.ID, key.Scope, *workflow)
	})
}

// adminConfig checks what KeyGet and KeyDelete are given.
func adminConfig(key Key, opts []Option) (*config, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	cfg := newConfig(opts)
	if cfg.err != nil {
		return nil, cfg.err
	}
	return cfg, nil
}

func notFound(key Key) error {
	return fmt.Errorf("%w: key %q in scope %q is not stored", ErrNotFound, key.ID, key.Scope)
}
