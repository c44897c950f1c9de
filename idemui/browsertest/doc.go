// Package browsertest drives idemui in a headless Chromium with chromedp, against a live
// engine: the runs list and its filters, a run whose steps advance while its page is open, a
// cancel through the confirmation page, and a read-only view that refuses.
//
// It is a module of its own so that chromedp stays out of idem's go.mod (idemui itself uses
// only the standard library, and cmd/idem imports it). It needs Chromium: Debian's chromium
// package, or IDEM_CHROMIUM naming a binary; without one the test fails and says so.
//
//	go test ./idemui/browsertest/
package browsertest
