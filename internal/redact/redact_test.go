package redact

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestHash(t *testing.T) {
	t.Parallel()
	h := Hash("s", "k")
	require.Len(t, h, 16)
	require.Equal(t, h, Hash("s", "k"))
	require.NotEqual(t, h, Hash("t", "k"), "the scope is in it")
	require.NotEqual(t, Hash("ab", "c"), Hash("a", "bc"), "parts do not run into each other")
}

func TestText(t *testing.T) {
	t.Parallel()
	a, b := Key{"s", "order-7f3a"}, Key{"s", "7f3a"}
	var k Keys
	msg := `idem: key "order-7f3a" in scope "s" is in flight; 7f3a again, and order-7f3aorder-7f3a`
	got := k.Text(msg, a, b)
	require.NotContains(t, got, "7f3a")
	require.Equal(t, `idem: key "`+k.Stand(a)+`" in scope "s" is in flight; `+k.Stand(b)+` again, and `+k.Stand(a)+k.Stand(a), got,
		"the longest ID wins where they overlap, and a replacement is not searched again")
	require.Equal(t, "nothing to hide", k.Text("nothing to hide", a))
	require.Equal(t, msg, Keys{Full: true}.Text(msg, a, b))

	// A hash's hex digits are not searched for a short ID after the replacement.
	short := Key{"s", "a"}
	got = k.Text("a order-7f3a", a, short)
	require.Equal(t, k.Stand(short)+" "+k.Stand(a), got)
}

func TestRecordError(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	_, span := tp.Tracer("t").Start(context.Background(), "op")
	key := Key{"s", "secret-key"}
	Keys{}.RecordError(span, errors.New(`failed on "secret-key"`), key)
	span.End()
	got := spans.GetSpans()[0]
	require.Equal(t, `failed on "`+Keys{}.Stand(key)+`"`, got.Status.Description)
	require.Len(t, got.Events, 1)
	require.Equal(t, "exception", got.Events[0].Name)
	for _, a := range got.Events[0].Attributes {
		require.NotContains(t, a.Value.String(), "secret-key")
		if a.Key == "exception.type" {
			require.True(t, strings.HasSuffix(a.Value.AsString(), "errorString"), a.Value.AsString())
		}
	}
}
