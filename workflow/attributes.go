package workflow

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/store"
)

// Limits on a run's attributes: how many a run may have, and how long a key and a value may be,
// in bytes. They keep the attributes an index, not a store: put documents in the run's input or
// in a step's output.
//
//	if len(attrs) > workflow.MaxAttributes { ... }
const (
	MaxAttributes        = 32
	MaxAttributeKeyLen   = 64
	MaxAttributeValueLen = 256
)

// validateAttributes checks attributes given as field ("RunOpts.Attributes"): keys of 1 to
// MaxAttributeKeyLen bytes and values of at most MaxAttributeValueLen, valid UTF-8 without
// control characters (Postgres's jsonb cannot hold a NUL; a newline would break the CLI's
// columns), at most MaxAttributes of them. An empty value is refused unless emptyOK (where it
// means "remove").
func validateAttributes(field string, attrs map[string]string, emptyOK bool) error {
	if len(attrs) > MaxAttributes {
		return fmt.Errorf("workflow: %s has %d attributes; a run can have at most %d", field, len(attrs), MaxAttributes)
	}
	keys := make([]string, 0, len(attrs))
	for k := range attrs {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the same map gives the same error
	for _, k := range keys {
		v := attrs[k]
		switch {
		case k == "":
			return fmt.Errorf("workflow: %s has an empty key; a key is 1 to %d bytes", field, MaxAttributeKeyLen)
		case len(k) > MaxAttributeKeyLen:
			return fmt.Errorf("workflow: %s key %q is %d bytes; a key can be at most %d", field, clipError(k, 80), len(k), MaxAttributeKeyLen)
		case len(v) > MaxAttributeValueLen:
			return fmt.Errorf("workflow: %s value of %q is %d bytes; a value can be at most %d", field, k, len(v), MaxAttributeValueLen)
		case v == "" && !emptyOK:
			return fmt.Errorf("workflow: %s value of %q is empty; leave the key out instead", field, k)
		}
		if err := plainText(k); err != nil {
			return fmt.Errorf("workflow: %s key %q %s", field, k, err)
		}
		if err := plainText(v); err != nil {
			return fmt.Errorf("workflow: %s value of %q %s", field, k, err)
		}
	}
	return nil
}

// plainText says what makes s unfit for an attribute: invalid UTF-8 or a control character.
func plainText(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("is not valid UTF-8")
	}
	for i, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fmt.Errorf("has control character %U at offset %d", r, i)
		}
	}
	return nil
}

// attributeLimitError is SetAttributesTx's refusal to go past MaxAttributes. A retry cannot fix
// it, so the step does not retry it.
type attributeLimitError struct{ count int }

func (e *attributeLimitError) Error() string {
	return fmt.Sprintf("workflow: SetAttributesTx would leave the run with %d attributes; a run can have at most %d (an empty value removes one)", e.count, MaxAttributes)
}

func (e *attributeLimitError) Retryable() bool { return false }

// SetAttributesTx sets attributes of the run from inside one of its Tx steps (steps.Tx, not a
// parallel branch's steps.GoTx), in the step's transaction t: they are written with the step's writes and checkpoint, so they change exactly
// once, when the step commits, and a replay of the step does not write them again. A key given
// an empty value is removed; other keys are added or replaced; keys not given stay. The run may
// have at most MaxAttributes afterwards (a permanent error otherwise, which fails the step
// without retries); keys and values are checked as for RunOpts.Attributes.
//
// Attributes are for finding runs: Engine.RunList and `idem runs list --attr k=v` filter on
// them, through an index, and Engine.RunGet shows them.
//
//	_, err := steps.Tx(ctx, "reserve", func(ctx context.Context, t pgx.Tx) (Hold, error) {
//		hold, err := reserve(ctx, t, req)
//		if err != nil {
//			return Hold{}, err
//		}
//		return hold, workflow.SetAttributesTx(ctx, t, map[string]string{"hold": hold.ID, "stage": "reserved"})
//	}, nil)
func SetAttributesTx(ctx context.Context, t pgx.Tx, attrs map[string]string) error {
	rs, ok := runFrom(ctx)
	if !ok {
		return errors.New("workflow: SetAttributesTx was called outside a workflow: ctx must be the context a Tx step's function receives")
	}
	if branch, ok := ctx.Value(branchKey{}).(string); ok {
		return fmt.Errorf("workflow: SetAttributesTx was called in step %q, a parallel branch (steps.GoTx); set attributes in a steps.Tx of the workflow's own line", branch)
	}
	rs.mu.Lock()
	inStep := rs.busy != ""
	rs.mu.Unlock()
	if !inStep || t == nil || rs.tx.view == nil || t != rs.tx.view {
		return errors.New("workflow: SetAttributesTx needs the transaction its Tx step received (steps.Tx), so that the attributes commit with the step")
	}
	if err := validateAttributes("SetAttributesTx's attrs", attrs, true); err != nil {
		return err
	}
	p := store.RunSetAttributesParams{LeaseParams: rs.lease(), Max: MaxAttributes, Set: map[string]string{}}
	for k, v := range attrs {
		if v == "" {
			p.Remove = append(p.Remove, k)
		} else {
			p.Set[k] = v
		}
	}
	r, err := rs.e.st.RunSetAttributes(ctx, t, p)
	switch {
	case err != nil:
		return fmt.Errorf("workflow: error setting attributes: %w", err)
	case r.Fenced:
		return rs.stop(fmt.Errorf("workflow: attributes cannot be set: %w", ErrLeaseLost))
	case !r.Set:
		return &attributeLimitError{count: r.Count}
	}
	return nil
}
