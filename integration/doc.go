// Package integration holds the end-to-end tests of idem: they build examples/bank, run it as a
// real process against a real Postgres, drive it over HTTP with many concurrent clients using
// idemhttp.Transport, inject faults (SIGKILL, connection resets, terminated backends, lost
// COMMIT acknowledgements, Postgres restarts) and then check the invariants by counting rows in
// Postgres, never by trusting the responses alone.
//
//	go test -race ./integration/
//	IDEM_CHAOS_REQUESTS=50000 IDEM_CRASH_KILLS=100 go test -race -timeout 60m -run Chaos ./integration/
//
// It has no non-test code; this file only documents it.
package integration
