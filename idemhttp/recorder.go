package idemhttp

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"time"
)

var (
	// ErrStreaming is returned by Flush (through http.ResponseController) to a handler that
	// tries to stream under an idempotency key. A streamed response cannot be stored before
	// the client sees it, and once the client has seen it the transaction can no longer be
	// rolled back, so the middleware refuses it: the transaction is rolled back and the client
	// gets a 500 (streaming-response-refused). Serve streams on routes, or methods, the
	// middleware does not guard.
	//
	//	if err := http.NewResponseController(w).Flush(); errors.Is(err, idemhttp.ErrStreaming) {
	//		return // the client gets a 500; nothing is committed
	//	}
	ErrStreaming = errors.New("idemhttp: a response under an idempotency key cannot be streamed; it is stored and sent when the handler returns")

	// ErrResponseTooLarge is returned by Write when the response would exceed
	// Config.MaxResponseBytes. The transaction is rolled back and the client gets a 500.
	//
	//	if _, err := w.Write(report); errors.Is(err, idemhttp.ErrResponseTooLarge) {
	//		return // raise Config.MaxResponseBytes, or page the report
	//	}
	ErrResponseTooLarge = errors.New("idemhttp: the response is larger than Config.MaxResponseBytes, so it cannot be stored")
)

// recorder is the ResponseWriter a guarded handler writes to. Nothing reaches the client until
// the transaction has committed (or rolled back), which is what makes running the handler again
// on a serialization failure safe: each attempt gets a fresh recorder.
//
// It offers Flush, so that handlers checking for http.Flusher find it, but no Hijack and no
// Unwrap: a handler must not get around the buffer to the connection.
type recorder struct {
	header   http.Header
	status   int         // 0 until the header is written
	sent     http.Header // header as at WriteHeader, as net/http snapshots it
	body     bytes.Buffer
	max      int64
	real     http.ResponseWriter // only for read and write deadlines
	streamed bool
	tooLarge bool
}

func newRecorder(real http.ResponseWriter, max int64) *recorder {
	return &recorder{header: make(http.Header), max: max, real: real}
}

func (rec *recorder) Header() http.Header { return rec.header }

func (rec *recorder) WriteHeader(code int) {
	// The same check, and message, as net/http's: an invalid code is a bug in the handler.
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	// Informational answers would go out before the final one; there is nothing to store of
	// them, and sending them now would let bytes reach the client before the commit.
	if code < 200 || rec.status != 0 {
		return
	}
	rec.status = code
	rec.sent = rec.header.Clone()
}

func (rec *recorder) Write(p []byte) (int, error) {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if int64(rec.body.Len())+int64(len(p)) > rec.max {
		rec.tooLarge = true
		return 0, ErrResponseTooLarge
	}
	return rec.body.Write(p)
}

func (rec *recorder) WriteString(s string) (int, error) {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if int64(rec.body.Len())+int64(len(s)) > rec.max {
		rec.tooLarge = true
		return 0, ErrResponseTooLarge
	}
	return rec.body.WriteString(s)
}

// Flush is for handlers that test for http.Flusher; see ErrStreaming.
func (rec *recorder) Flush() { rec.streamed = true }

// FlushError is what http.ResponseController.Flush calls.
func (rec *recorder) FlushError() error {
	rec.streamed = true
	return ErrStreaming
}

// Deadlines do not let bytes out, so they pass through to the connection.
func (rec *recorder) SetReadDeadline(t time.Time) error {
	return http.NewResponseController(rec.real).SetReadDeadline(t)
}

func (rec *recorder) SetWriteDeadline(t time.Time) error {
	return http.NewResponseController(rec.real).SetWriteDeadline(t)
}

// finish completes the response as net/http would for a handler that returns without writing.
func (rec *recorder) finish() {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
}
