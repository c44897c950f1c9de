package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem/internal/page"
	"github.com/idemkit/idem/internal/store"
)

// Page sizes of [KeyList]: KeyListParams.Limit 0 means DefaultKeyListLimit, and a Limit over
// MaxKeyListLimit is refused.
//
//	res, err := idem.KeyList(ctx, pool, &idem.KeyListParams{Scope: "customer:42", Limit: idem.MaxKeyListLimit})
const (
	DefaultKeyListLimit = 100
	MaxKeyListLimit     = 1000
)

// ErrInvalidCursor is [KeyList]'s answer to a KeyListParams.After that is not a cursor it made
// for the same scope.
//
//	if errors.Is(err, idem.ErrInvalidCursor) { // start again from the first page
//	}
var ErrInvalidCursor = errors.New("idem: invalid KeyList cursor")

// KeyListParams select and page [KeyList].
//
//	params := &idem.KeyListParams{Scope: "customer:42", Prefix: "order-", Limit: 50}
type KeyListParams struct {
	// Scope is the scope whose keys are listed; required. Keys are listed one scope at a time,
	// as they are stored: a scope is a tenant.
	Scope string

	// Prefix lists only the ids that start with it; "" lists all.
	Prefix string

	// After is the cursor of the page before (KeyListResult.Next): this page starts after it.
	After string

	// Limit is the page size: default 100, at most 1000.
	Limit int
}

// KeyListResult is a page of keys, in the byte order of their ids.
//
//	for params := (&idem.KeyListParams{Scope: scope}); ; {
//		res, err := idem.KeyList(ctx, pool, params)
//		...
//		if res.Next == "" { break }
//		params.After = res.Next
//	}
type KeyListResult struct {
	Keys []*KeyInfo `json:"keys"`
	// Next is the cursor of the next page, "" when this page is the last.
	Next string `json:"next,omitempty"`
}

// KeyList lists the keys stored in a scope, in the byte order of their ids, without side
// effects: the keys of Do (expired ones included, until Reap deletes them) and of workflow runs,
// each as [KeyGet] reads it. It answers an operator's "which keys did this client send?".
//
// Pages follow the primary key, so each costs an index range scan of at most Limit+1 rows
// however many keys the scope holds, and paging on with KeyListResult.Next neither repeats nor
// skips a key that existed when the first page was read. A cursor that KeyList did not make for
// this scope is [ErrInvalidCursor]; a Limit over 1000, a negative one, or a Prefix that no key
// id can start with (ids are printable ASCII) is refused. The [Schema] option names the schema,
// as for [Do].
//
//	res, err := idem.KeyList(ctx, pool, &idem.KeyListParams{Scope: "customer:42", Prefix: "order-"})
//	for _, k := range res.Keys {
//		fmt.Println(k.ID, k.Created, k.Expired)
//	}
func KeyList(ctx context.Context, db Querier, params *KeyListParams, opts ...Option) (*KeyListResult, error) {
	if db == nil {
		return nil, errors.New("idem: KeyList needs a database; db is nil")
	}
	if params == nil {
		params = &KeyListParams{}
	}
	cfg := newConfig(opts)
	if cfg.err != nil {
		return nil, cfg.err
	}
	p, err := keyListParams(params)
	if err != nil {
		return nil, err
	}
	limit := p.Limit
	p.Limit++ // one row more than the page, so that Next is "" on the last page
	records, err := store.For(cfg.schema).KeyList(ctx, db, p)
	if err != nil {
		return nil, lookupError(cfg, err)
	}
	res := &KeyListResult{Keys: make([]*KeyInfo, 0, min(len(records), limit))}
	for _, k := range records[:min(len(records), limit)] {
		res.Keys = append(res.Keys, keyInfo(k))
	}
	if len(records) > limit {
		res.Next = encodeKeyCursor(params.Scope, records[limit-1].ID)
	}
	return res, nil
}

// keyListParams checks what KeyList is given, and makes the statement's parameters of it.
func keyListParams(params *KeyListParams) (store.KeyListParams, error) {
	p := store.KeyListParams{Scope: params.Scope, Prefix: params.Prefix, Limit: params.Limit}
	if params.Scope == "" {
		return p, errors.New("idem: KeyListParams.Scope cannot be empty: keys are listed one scope at a time")
	}
	if err := validateScope(params.Scope); err != nil {
		return p, fmt.Errorf("idem: KeyListParams.Scope is not a scope: %w", err)
	}
	if params.Prefix != "" {
		if err := ValidateID(params.Prefix); err != nil {
			var invalid *InvalidKeyError
			errors.As(err, &invalid)
			return p, fmt.Errorf("idem: KeyListParams.Prefix cannot start a key's ID, so no key has it: %s", invalid.Reason)
		}
	}
	var err error
	if p.Limit, err = page.Limit("idem: KeyListParams.Limit", params.Limit, DefaultKeyListLimit, MaxKeyListLimit); err != nil {
		return p, err
	}
	if params.After != "" {
		id, err := decodeKeyCursor(params.Scope, params.After)
		if err != nil {
			return p, err
		}
		p.After = id
	}
	return p, nil
}

type keyCursor struct {
	Scope string `json:"s"`
	ID    string `json:"i"`
}

func encodeKeyCursor(scope, id string) string { return page.Encode(keyCursor{Scope: scope, ID: id}) }

// decodeKeyCursor reads a cursor of KeyList's for scope. A cursor holds a stored key, which
// passed Validate when it was stored, and the scope it was listed in: anything else was forged,
// or belongs to another listing.
func decodeKeyCursor(scope, s string) (string, error) {
	var c keyCursor
	if !page.Decode(s, &c) || (Key{Scope: c.Scope, ID: c.ID}).Validate() != nil || c.Scope != scope {
		return "", fmt.Errorf("%w: KeyListParams.After %s is not a cursor from KeyListResult.Next of a listing of this scope", ErrInvalidCursor, page.Quote(s))
	}
	return c.ID, nil
}
