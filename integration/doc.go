// Package integration holds the end-to-end tests of idem: they build examples/bank, run it as a
// real process against a real Postgres, drive it over HTTP with many concurrent clients using
// idemhttp.Transport, inject faults (SIGKILL, connection resets, terminated backends, lost
// COMMIT acknowledgements, Postgres restarts) and then check the invariants by counting rows in
// Postgres, never by trusting the responses alone.
//
//	go test -race ./integration/
//	IDEM_CHAOS_REQUESTS=50000 IDEM_CHAOS_SECONDS=3000 go test -race -timeout 60m -run 'TestChaos$' ./integration/
//
// TestChaos and TestPostgresRestart start a Postgres of their own, so that the one's reconnection
// storms and the other's restarts never hold up the other tests' connections.
//
// It has no non-test code; this file only documents it.
package integration
