package idemhttp_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemhttp"
)

// TestHeaderScopeRepeated: a request that carries the scope's header twice names two identities;
// taking the first would file the key under whichever one a proxy happened to put first. It is
// refused with a 400 problem, and nothing runs or is stored.
func TestHeaderScopeRepeated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.middleware(t, &idemhttp.Config{Scope: idemhttp.HeaderScope("X-Api-Key")})(http.HandlerFunc(b.create))

	r := request("POST", "/orders", "k-1", `{}`)
	r.Header.Add("X-Api-Key", "secret-1")
	r.Header.Add("X-Api-Key", "secret-2")
	w := serve(h, r)
	p := problem(t, w, http.StatusBadRequest, "idempotency-scope-ambiguous")
	require.Contains(t, p.Detail, "X-Api-Key")
	require.NotContains(t, p.Detail, "secret")
	require.Zero(t, b.runs.Load())
	require.Zero(t, b.storedKeys(t))

	// One value is a scope, as before.
	r = request("POST", "/orders", "k-1", `{}`)
	r.Header.Set("X-Api-Key", "secret-1")
	require.Equal(t, http.StatusCreated, serve(h, r).Code)
}
