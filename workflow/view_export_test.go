package workflow

// TraceIDOf is traceID, for TestTraceID.
var TraceIDOf = traceID
