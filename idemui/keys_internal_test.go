package idemui

import "testing"

func TestStoredStatus(t *testing.T) {
	t.Parallel()
	for result, want := range map[string]string{
		`{"status":201,"header":{"Location":["/o/1"]},"body":"e30="}`: "HTTP 201 Created",
		`{"status":404}`: "HTTP 404 Not Found",
		`{"type":"bank.v1.Receipt","message":"CgE="}`: "gRPC response bank.v1.Receipt",
		`{"status":"CAUSBG5vcGU="}`:                   "gRPC error",
		`{"status":"settled","amount":5}`:             "", // an application's own value
		`{"status":99}`:                               "",
		`{"status":201,"receipt":"r-1"}`:              "",
		`[1,2]`:                                       "",
		`not json`:                                    "",
	} {
		if got := storedStatus([]byte(result)); got != want {
			t.Errorf("storedStatus(%s) = %q, want %q", result, got, want)
		}
	}
}
