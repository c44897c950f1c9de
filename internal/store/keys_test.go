package store

import (
	"crypto/sha256"
	"encoding/binary"
	"hash/fnv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLockID pins the in-flight lock to a truncated SHA-256 of the length-prefixed parts: a
// hash a client cannot steer, so that a key crafted by one tenant cannot collide with another
// tenant's in-flight key on purpose (a 64-bit FNV-1a, as before, can be aimed at).
func TestLockID(t *testing.T) {
	t.Parallel()
	var buf []byte
	for _, part := range []string{"idem.lock.v1", "billing", "tenant-a", "key-1"} {
		buf = binary.BigEndian.AppendUint64(buf, uint64(len(part)))
		buf = append(buf, part...)
	}
	sum := sha256.Sum256(buf)
	require.Equal(t, int64(binary.BigEndian.Uint64(sum[:8])), LockID("billing", "tenant-a", "key-1"))

	// Every part counts, and parts do not run into each other.
	seen := map[int64]string{}
	for _, k := range [][3]string{{"", "a", "bc"}, {"", "ab", "c"}, {"x", "a", "bc"}, {"", "a", "bd"}, {"", "b", "bc"}} {
		id := LockID(k[0], k[1], k[2])
		require.NotContains(t, seen, id, "%v collides with %v", k, seen[id])
		seen[id] = k[0] + "|" + k[1] + "|" + k[2]
	}
}

// TestLockIDSchemaSpellings: every spelling of a schema that names the same tables takes the
// same lock, and different schemas take different ones.
func TestLockIDSchemaSpellings(t *testing.T) {
	t.Parallel()
	same := func(a, b string) {
		t.Helper()
		require.Equal(t, LockID(a, "s", "k"), LockID(b, "s", "k"), "%q and %q", a, b)
	}
	same("", "public")
	same("billing", "bill\x00ing")  // pgx drops NUL bytes from an identifier
	long := strings.Repeat("é", 40) // 80 bytes; Postgres keeps 63, at a character boundary: 31 é
	same(long, strings.Repeat("é", 31))
	require.NotEqual(t, LockID("billing", "s", "k"), LockID("", "s", "k"))
	require.NotEqual(t, LockID("Public", "s", "k"), LockID("public", "s", "k"), "a quoted identifier keeps its case")
}

// BenchmarkLockID measures what the cryptographic hash costs against the FNV-1a it replaced.
//
//	go test -run '^$' -bench LockID ./internal/store/
func BenchmarkLockID(b *testing.B) {
	scope, id := "customer:4711", "0199b3c2-6a5e-7d4c-9f0e-2b1a3c4d5e6f"
	b.Run("sha256", func(b *testing.B) {
		for range b.N {
			_ = LockID("", scope, id)
		}
	})
	b.Run("fnv1a", func(b *testing.B) {
		for range b.N {
			h := fnv.New64a()
			h.Write([]byte("idem\x00"))
			h.Write([]byte{0})
			h.Write([]byte(scope))
			h.Write([]byte{0})
			h.Write([]byte(id))
			_ = int64(h.Sum64())
		}
	})
}
