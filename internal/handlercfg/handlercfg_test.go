package handlercfg

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestOptions(t *testing.T) {
	for _, tc := range []struct {
		store Store
		want  string // in the error; "" for none
	}{
		{Store{}, ""},
		{Store{TTL: time.Hour, Wait: time.Second, Schema: "s", Isolation: pgx.Serializable, MaxAttempts: 3}, ""},
		{Store{TTL: time.Millisecond}, "pkg: TTL cannot be less than one second"},
		{Store{Wait: -1}, "Wait cannot be negative"},
		{Store{InFlightRetryAfter: time.Millisecond}, "pkg: RetryField cannot be less than one second"},
		{Store{Schema: strings.Repeat("s", 64)}, "Schema cannot be longer than 63 bytes"},
		{Store{MaxAttempts: -1}, "MaxAttempts cannot be negative"},
		{Store{MinBackoff: time.Second, MaxBackoff: time.Millisecond}, "MaxBackoff cannot be less than MinBackoff"},
		{Store{Isolation: "chaos"}, `Isolation must be one of`},
	} {
		keyOpts, txOpts, err := tc.store.Options("pkg", "RetryField")
		if tc.want == "" {
			if err != nil || len(keyOpts) == 0 || len(txOpts) == 0 {
				t.Fatalf("%+v: got %v, %d key options, %d tx options", tc.store, err, len(keyOpts), len(txOpts))
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%+v: want an error with %q, got %v", tc.store, tc.want, err)
		}
	}
}

func TestOptionsFillsDefaults(t *testing.T) {
	s := Store{MinBackoff: time.Second}
	if _, _, err := s.Options("pkg", "F"); err != nil {
		t.Fatal(err)
	}
	if s.InFlightRetryAfter != time.Second || s.MinBackoff != time.Second || s.MaxBackoff != time.Second {
		t.Fatalf("defaults not filled as documented: %+v", s)
	}
}
