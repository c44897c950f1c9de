package txown

import "testing"

// TestScanControl holds the lexer to Postgres's reading of each statement: a keyword counts only
// where a statement starts, never inside a comment, a string or a quoted identifier.
func TestScanControl(t *testing.T) {
	t.Parallel()
	for sql, want := range map[string]control{
		"SELECT 1":                               controlNone,
		"INSERT INTO t VALUES ('COMMIT')":        controlNone,
		`SELECT "commit" FROM t`:                 controlNone,
		"SELECT 1 -- ; COMMIT":                   controlNone,
		"SELECT 1 /* ; COMMIT */":                controlNone,
		"SELECT $$ ; COMMIT $$":                  controlNone,
		"SELECT $a$ ; $$ COMMIT $a$":             controlNone,
		"SELECT a$b$ FROM t; SELECT 1":           controlNone,
		`SELECT E'\'; COMMIT; --'`:               controlNone,
		"SELECT 'it''s; commit'":                 controlNone,
		"COMMENT ON TABLE t IS 'x'":              controlNone,
		"ENDPOINT":                               controlNone,
		"PREPARE p AS SELECT 1":                  controlNone,
		"BEGIN":                                  controlNone, // a warning inside a transaction, nothing more
		"SAVEPOINT s":                            controlSavepoint,
		"release savepoint s":                    controlSavepoint,
		"ROLLBACK TO s":                          controlSavepoint,
		"ROLLBACK WORK TO SAVEPOINT s":           controlSavepoint,
		"rollback /* x */ transaction /**/ to s": controlSavepoint,
		"COMMIT":                                 controlEnds,
		"  commit work":                          controlEnds,
		"/* c */ ROLLBACK":                       controlEnds,
		"/* a /* nested */ b */ ROLLBACK":        controlEnds,
		"-- c\nCOMMIT":                           controlEnds,
		"-- c\r\nCOMMIT":                         controlEnds,
		"END":                                    controlEnds,
		"ABORT":                                  controlEnds,
		"ROLLBACK AND CHAIN":                     controlEnds,
		"PREPARE TRANSACTION 'x'":                controlEnds,
		"COMMIT PREPARED 'x'":                    controlEnds,
		"SELECT 1; COMMIT":                       controlEnds,
		"SELECT ';'; ROLLBACK":                   controlEnds,
		"SELECT $$;$$; END":                      controlEnds,
		`SELECT "a;b"; ABORT`:                    controlEnds,
		"SAVEPOINT s; COMMIT":                    controlEnds,
		"(COMMIT)":                               controlEnds,
		"SELECT $1; COMMIT":                      controlEnds,
		"SELECT 'a\\'; COMMIT; --'":              controlEnds, // standard strings: the quote after \ closes
	} {
		if got := scanControl(sql, true); got != want {
			t.Errorf("scanControl(%q) = %d, want %d", sql, got, want)
		}
	}
	// With standard_conforming_strings off, a backslash escapes the quote in '...'.
	if got := scanControl("SELECT 'a\\'; COMMIT; --'", false); got != controlNone {
		t.Errorf("with backslash escapes, the COMMIT is inside the string; got %d", got)
	}
}
