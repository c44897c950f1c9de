package txown

import "strings"

// control is what a piece of SQL does to the transaction it is sent in.
type control int

const (
	controlNone      control = iota
	controlSavepoint         // SAVEPOINT, RELEASE, ROLLBACK TO: the transaction goes on
	controlEnds              // COMMIT, END, ROLLBACK, ABORT, PREPARE TRANSACTION: it ends
)

// scanControl reads every statement in sql (the simple protocol runs several in one string) and
// says what the strongest of them does to the transaction. It is a lexer, not a prefix match:
// comments (nested ones included), quoted identifiers, string constants in each of their forms
// and dollar-quoted bodies are skipped the way Postgres's scanner skips them, so that a keyword
// counts only where Postgres would read it as the start of a statement. stdStrings is the
// session's standard_conforming_strings: off, a backslash escapes a quote in '...' too.
//
// Only the top level can end a transaction block: COMMIT inside a DO block or a procedure is an
// error there, and PREPARE cannot prepare a transaction statement.
func scanControl(sql string, stdStrings bool) control {
	out := controlNone
	i := 0
	for i < len(sql) {
		i = skipSpace(sql, i)
		if i >= len(sql) {
			break
		}
		word, next := readWord(sql, i)
		if c := statementControl(sql, word, next); c > out {
			out = c
		}
		i = statementEnd(sql, i, stdStrings)
	}
	return out
}

// statementControl classifies a statement by its first word (and the words after it that
// decide).
func statementControl(sql, word string, next int) control {
	switch {
	case strings.EqualFold(word, "commit"), strings.EqualFold(word, "end"), strings.EqualFold(word, "abort"):
		return controlEnds
	case strings.EqualFold(word, "savepoint"), strings.EqualFold(word, "release"):
		return controlSavepoint
	case strings.EqualFold(word, "rollback"):
		// ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name stays in the transaction.
		w, n := readWord(sql, skipSpace(sql, next))
		if strings.EqualFold(w, "work") || strings.EqualFold(w, "transaction") {
			w, _ = readWord(sql, skipSpace(sql, n))
		}
		if strings.EqualFold(w, "to") {
			return controlSavepoint
		}
		return controlEnds
	case strings.EqualFold(word, "prepare"):
		if w, _ := readWord(sql, skipSpace(sql, next)); strings.EqualFold(w, "transaction") {
			return controlEnds
		}
	}
	return controlNone
}

// skipSpace skips whitespace, comments and opening parentheses from i.
func skipSpace(sql string, i int) int {
	for i < len(sql) {
		switch c := sql[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == '(':
			i++
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			i = lineCommentEnd(sql, i)
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			i = blockCommentEnd(sql, i)
		default:
			return i
		}
	}
	return i
}

func lineCommentEnd(sql string, i int) int {
	for i < len(sql) && sql[i] != '\n' && sql[i] != '\r' {
		i++
	}
	return i
}

// blockCommentEnd returns the index after the comment that starts at i; Postgres nests them.
func blockCommentEnd(sql string, i int) int {
	depth := 0
	for i < len(sql) {
		switch {
		case strings.HasPrefix(sql[i:], "/*"):
			depth++
			i += 2
		case strings.HasPrefix(sql[i:], "*/"):
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return i
}

func identByte(c byte) bool {
	return c == '_' || c == '$' || c >= 0x80 || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9')
}

// readWord reads the unquoted identifier or keyword at i, if any.
func readWord(sql string, i int) (string, int) {
	j := i
	for j < len(sql) && identByte(sql[j]) && (j > i || sql[j] != '$') {
		j++
	}
	return sql[i:j], j
}

// statementEnd returns the index after the ';' that ends the statement starting at i, or the
// end of sql.
func statementEnd(sql string, i int, stdStrings bool) int {
	for i < len(sql) {
		c := sql[i]
		switch {
		case c == ';':
			return i + 1
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			i = lineCommentEnd(sql, i)
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			i = blockCommentEnd(sql, i)
		case c == '"':
			i = quotedEnd(sql, i, '"', false)
		case c == '\'':
			i = quotedEnd(sql, i, '\'', !stdStrings)
		case (c == 'e' || c == 'E') && i+1 < len(sql) && sql[i+1] == '\'' && (i == 0 || !identByte(sql[i-1])):
			i = quotedEnd(sql, i+1, '\'', true)
		case c == '$':
			i = dollarEnd(sql, i)
		case identByte(c):
			// A whole word, so that a '$' inside an identifier (a$b$) is not read as a quote.
			for i < len(sql) && identByte(sql[i]) {
				i++
			}
		default:
			i++
		}
	}
	return i
}

// quotedEnd returns the index after the quoted text that opens at i: doubled quotes stay inside,
// and with backslashes on, so does an escaped one.
func quotedEnd(sql string, i int, q byte, backslashes bool) int {
	for i++; i < len(sql); i++ {
		switch sql[i] {
		case '\\':
			if backslashes {
				i++
			}
		case q:
			if i+1 < len(sql) && sql[i+1] == q {
				i++
				continue
			}
			return i + 1
		}
	}
	return i
}

// dollarEnd returns the index after the dollar-quoted string that opens at i ($$ or $tag$), or
// after the '$' when none opens there (a parameter such as $1).
func dollarEnd(sql string, i int) int {
	j := i + 1
	if j < len(sql) && '0' <= sql[j] && sql[j] <= '9' {
		return j
	}
	for j < len(sql) && identByte(sql[j]) && sql[j] != '$' {
		j++
	}
	if j >= len(sql) || sql[j] != '$' {
		return i + 1
	}
	tag := sql[i : j+1]
	if end := strings.Index(sql[j+1:], tag); end >= 0 {
		return j + 1 + end + len(tag)
	}
	return len(sql)
}
