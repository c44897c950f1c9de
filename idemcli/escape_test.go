package idemcli

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEscape: what a terminal acts on is spelt out, the rest is left alone, and escaping twice
// changes nothing (a clipped, escaped cell goes through row again).
func TestEscape(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain café ✓ \\n":       "plain café ✓ \\n",
		"\x1b[31mred\x07":        `\x1b[31mred\x07`,
		"a\tb\r\nc\x7f":          `a\tb\r\nc\x7f`,
		"\u009b31m\u0085":        `\u009b31m\u0085`,
		"abc\u202edef\u2066":     `abc\u202edef\u2066`,
		"zero\u200bwidth\u2028":  `zero\u200bwidth\u2028`,
		"bad \xff\xfe utf8 \xc3": `bad \xff\xfe utf8 \xc3`,
	} {
		got := escape(in)
		require.Equal(t, want, got, "%q", in)
		require.Equal(t, got, escape(got), "idempotent on %q", in)
	}
	require.Equal(t, `\x1b[2J`+"…", clip("\x1b[2Jxxxxxxxx", 8), "clipped after escaping")
}
