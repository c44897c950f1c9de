package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idemkit/idem/internal/store"
)

// KeyResult reads the result Do stored under key, as the JSON a replay decodes (for idemhttp, a
// StoredResponse: status, headers and body). It is the client's answer, and may hold what only
// the client should see: [KeyGet] tells its size without it, and an operator's tool should show
// it only where that is allowed (idemui shows it with Options.ShowResults). Reading has no side
// effect; an expired result is read as it is (see KeyInfo.Expired) until Reap deletes its key,
// or, for a result over 1 KiB (kept in a partition of idem_results by the day its key expires),
// until Reap drops that day's partition, a day after the day it expired.
//
//   - No such key, or its large result dropped with its day: [ErrNotFound].
//   - A key of a workflow run: an error that says so (a run's output is in its RunGet).
//   - A key whose Do has not committed yet: nil, no error.
//
// The [Schema] option names the schema, as for [Do].
//
//	result, err := idem.KeyResult(ctx, pool, idem.Key{Scope: "customer:42", ID: "order-7f3a"})
//	var resp idemhttp.StoredResponse
//	err = json.Unmarshal(result, &resp) // for a key of idemhttp's middleware
func KeyResult(ctx context.Context, db Querier, key Key, opts ...Option) (json.RawMessage, error) {
	if db == nil {
		return nil, errors.New("idem: KeyResult needs a database; db is nil")
	}
	cfg, err := adminConfig(key, opts)
	if err != nil {
		return nil, err
	}
	result, workflow, ok, err := store.For(cfg.schema).KeyResult(ctx, db, key.Scope, key.ID)
	switch {
	case err != nil:
		return nil, lookupError(cfg, err)
	case !ok:
		return nil, notFound(key)
	case workflow != nil:
		return nil, fmt.Errorf("idem: key %q in scope %q belongs to a run of workflow %q, which stores no result under it; its output is the run's (Engine.RunGet)", key.ID, key.Scope, *workflow)
	}
	return result, nil
}
