package idemcli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"
)

// table writes aligned columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer) *table { return &table{tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)} }

// row writes one line of cells, each made safe for the terminal and clipped to maxCell.
func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = clip(c, maxCell)
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() { t.tw.Flush() }

// maxCell is the most characters a table cell shows; --json prints everything.
const maxCell = 200

// clip makes s safe for the terminal (see escape) and shortens it to n characters, for a table
// cell.
func clip(s string, n int) string {
	s = escape(s)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// escape spells out, as Go's escapes do, what a terminal would act on instead of showing: the
// stored strings idem prints (error texts, workflow and step names, scopes, inputs) come from
// clients and from workflow code, and an escape sequence among them could retitle the window,
// clear the screen or hide a line; a right-to-left override could reverse what follows; a tab
// or a line break would break the table. C0 and C1 controls, DEL, Unicode's format characters
// (bidirectional overrides, zero-width joiners), line and paragraph separators, and bytes that
// are not UTF-8 are escaped; everything else, backslashes included, is shown as it is. escape
// is idempotent: what it returns has nothing left to escape.
func escape(s string) string {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if needsEscape(r, size) {
			break
		}
		i += size
	}
	if i == len(s) {
		return s // the common case: nothing to escape, no copy
	}
	var b strings.Builder
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case !needsEscape(r, size):
			b.WriteString(s[i : i+size])
		case r == utf8.RuneError:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += size
	}
	return b.String()
}

func needsEscape(r rune, size int) bool {
	switch {
	case r == utf8.RuneError && size <= 1:
		return true
	case r < 0x20, r == 0x7f, r >= 0x80 && r < 0xa0:
		return true
	}
	return r >= 0xa0 && (unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Zl, r) || unicode.Is(unicode.Zp, r))
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func stampPtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return stamp(*t)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (c *call) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// done prints the outcome of a command that changes something: msg, or v with --json.
func (c *call) done(msg string, v any) error {
	if c.json {
		return c.printJSON(v)
	}
	_, err := fmt.Fprintln(c.stdout, msg)
	return err
}
