// Package keyctx records in a context which keys the idem.Do calls up the stack hold, so that a
// workflow started inside Do's function under Do's own key is refused at once, with a message
// that says why, instead of failing the transaction at its end.
package keyctx

import "context"

type holding struct {
	schema, scope, id string
	next              *holding
}

type ctxKey struct{}

// With returns ctx noting that a Do holds (schema, scope, id).
func With(ctx context.Context, schema, scope, id string) context.Context {
	next, _ := ctx.Value(ctxKey{}).(*holding)
	return context.WithValue(ctx, ctxKey{}, &holding{schema: schema, scope: scope, id: id, next: next})
}

// Held reports whether a Do up the stack of ctx holds (schema, scope, id).
func Held(ctx context.Context, schema, scope, id string) bool {
	for h, _ := ctx.Value(ctxKey{}).(*holding); h != nil; h = h.next {
		if h.schema == schema && h.scope == scope && h.id == id {
			return true
		}
	}
	return false
}
