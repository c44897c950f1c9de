// Package idemui is a web view of idem's workflow runs, keys, schedules and outbox: an
// http.Handler the application mounts behind its own authentication, as River UI's handler is,
// or that `idem ui` serves on its own.
//
// It shows the runs list (filters by state, workflow, code version, scope, attribute and time;
// keyset paging; counts per state, exact through the partial index on state and estimated where
// counting would be costly), a run (its steps as a timeline with how long each took, failed
// attempts and their errors, steps replayed from a fork, signals sent and consumed, events,
// children and parent, lease owner and expiry, deadline, what it waits for, its code version and
// where its code diverged from its history; reloaded every two seconds while it is unfinished), a
// scope's keys (idem.KeyList), a key (owner, hash, fingerprint, times, the size of its stored
// result and, for a response of idemhttp or idemgrpc, its status; the result itself only with
// Options.ShowResults), schedules, and the outbox (its lanes with their relay and lag, and its
// messages, those that need an operator first). Inputs and outputs are pretty-printed and clipped at
// Options.ClipBytes, with the whole value a download away.
//
// Pages are rendered on the server with html/template from a few KB of embedded HTML, CSS and
// JavaScript: no build step, and every page reads without JavaScript. Every stored string is
// escaped, control characters are shown as \u escapes, and a Content-Security-Policy allows
// only the handler's own script.
//
// It is read-only unless Options.AllowActions: then it can cancel (with a reason), resume and
// fork a run, delete a key of idem.Do's, pause, resume and trigger a schedule, and retry or skip
// an outbox message. Each action
// is a POST from a confirmation page, with a CSRF token and a same-origin check
// (Sec-Fetch-Site, or Origin), and is logged with the user Options.User names (and keys by
// their hash, as every record idem makes, unless Options.RecordKeys). Without
// AllowActions every POST is refused with 403.
//
// Mounting it under a prefix, behind the application's own check:
//
//	ui, err := idemui.NewHandler(engine, &idemui.Options{
//		Prefix:       "/ops/idem",
//		AllowActions: true,
//		User:         func(r *http.Request) string { return r.Header.Get("X-Forwarded-User") },
//		TraceURL:     "https://tracing.example.com/trace/{trace_id}",
//	})
//	if err != nil {
//		return err
//	}
//	mux.Handle("/ops/idem/", requireOperator(ui)) // your authentication and authorisation
//
// The handler uses only the standard library and idem's own API (Engine.RunList, RunGet,
// RunCounts, RunActivity, ScheduleList, idem.KeyGet, and the admin operations), so it adds no
// dependency to an application's go.mod.
package idemui
