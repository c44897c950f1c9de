package idemhttp

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
)

// benchBodies are 1 MiB JSON bodies of the shapes that cost a canonicaliser the most: wide (many
// members in one object, in order, in reverse order and shuffled), deep (objects nested 500 deep around a large
// value, each level's members in and out of order), and many small objects out of order.
func benchBodies() map[string][]byte {
	const size = 1 << 20
	var b strings.Builder
	wide := func(order string) []byte {
		b.Reset()
		b.WriteString("{")
		n := size / 28
		shuffled := rand.New(rand.NewPCG(1, 2)).Perm(n)
		for i := range n {
			k := i
			switch order {
			case "reversed":
				k = n - i
			case "shuffled":
				k = shuffled[i]
			}
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"key-%08d":"value-%04d"`, k, i%10000)
		}
		b.WriteString("}")
		return []byte(b.String())
	}
	deep := func(unsorted bool) []byte {
		b.Reset()
		const depth = 500
		for range depth {
			if unsorted {
				b.WriteString(`{"z":1,"a":`)
			} else {
				b.WriteString(`{"a":`)
			}
		}
		b.WriteString(`"` + strings.Repeat("x", size-depth*12) + `"`)
		b.WriteString(strings.Repeat("}", depth))
		return []byte(b.String())
	}
	small := func() []byte {
		b.Reset()
		b.WriteString("[")
		for i := 0; b.Len() < size; i++ {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(`{"b":0,"a":1}`)
		}
		b.WriteString("]")
		return []byte(b.String())
	}
	return map[string][]byte{
		"wide-sorted": wide("sorted"), "wide-unsorted": wide("reversed"), "wide-shuffled": wide("shuffled"),
		"deep-sorted": deep(false), "deep-unsorted": deep(true),
		"small-objects-unsorted": small(),
	}
}

// BenchmarkFingerprint compares DefaultFingerprint of each 1 MiB JSON body with a SHA-256 of the
// same bytes, in one run, so that the ratio (not the absolute figure) is what to quote. B/op of
// the fingerprint against the body's size is the allocation ratio.
//
//	go test -run '^$' -bench Fingerprint -benchmem -count 3 ./idemhttp/
func BenchmarkFingerprint(b *testing.B) {
	bodies := benchBodies()
	for _, name := range []string{"wide-sorted", "wide-unsorted", "wide-shuffled", "deep-sorted", "deep-unsorted", "small-objects-unsorted"} {
		body := bodies[name]
		r := httptest.NewRequest("POST", "/orders", nil)
		r.Header.Set("Content-Type", "application/json")
		b.Run(name+"/sha256", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for range b.N {
				_ = sha256.Sum256(body)
			}
		})
		b.Run(name+"/fingerprint", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for range b.N {
				_ = DefaultFingerprint(r, body)
			}
		})
	}
}

// BenchmarkFingerprintRatio reports, for each body, the fastest DefaultFingerprint over the
// fastest SHA-256 of the same bytes ("x-sha256"), the two run alternately in each iteration: on a
// machine shared with other work, the fastest run of each is the one least disturbed, and
// alternating exposes both to the same moments. Run it with -count 3 or more and quote the
// ratios.
//
//	go test -run '^$' -bench FingerprintRatio -benchtime 60x -count 3 ./idemhttp/
func BenchmarkFingerprintRatio(b *testing.B) {
	bodies := benchBodies()
	for _, name := range []string{"wide-sorted", "wide-unsorted", "wide-shuffled", "deep-sorted", "deep-unsorted", "small-objects-unsorted"} {
		body := bodies[name]
		r := httptest.NewRequest("POST", "/orders", nil)
		r.Header.Set("Content-Type", "application/json")
		b.Run(name, func(b *testing.B) {
			sha, fp := time.Duration(1<<62), time.Duration(1<<62)
			for range b.N {
				start := time.Now()
				_ = sha256.Sum256(body)
				sha = min(sha, time.Since(start))
				start = time.Now()
				_ = DefaultFingerprint(r, body)
				fp = min(fp, time.Since(start))
			}
			b.ReportMetric(float64(fp)/float64(sha), "x-sha256")
		})
	}
}

// TestFingerprintAllocation: fingerprinting a 1 MiB body of any of the shapes, deep or wide,
// members in order or not, many small objects out of order included, allocates at most twice its
// size, so that a client cannot make the server allocate many times what it sent. (Bytes
// allocated are counted, not time, which BenchmarkFingerprint measures.)
func TestFingerprintAllocation(t *testing.T) {
	for name, body := range benchBodies() {
		r := httptest.NewRequest("POST", "/orders", nil)
		r.Header.Set("Content-Type", "application/json")
		canonical := false
		if _, err := CanonicalJSON(body); err == nil {
			canonical = true
		}
		if !canonical {
			t.Fatalf("%s: the benchmark body is not canonicalisable JSON", name)
		}
		least := uint64(1 << 62)
		for range 3 {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_ = DefaultFingerprint(r, body)
			runtime.ReadMemStats(&after)
			least = min(least, after.TotalAlloc-before.TotalAlloc)
		}
		if limit := 2 * uint64(len(body)); least > limit {
			t.Errorf("%s: fingerprinting a %d-byte body allocated %d bytes (%.1f×), more than twice its size", name, len(body), least, float64(least)/float64(len(body)))
		}
	}
}
