package idemgrpc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/handlercfg"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/tx"
)

// Defaults used for the zero values of [Config].
const (
	// DefaultKeyMetadata is the request metadata key that carries the idempotency key: the
	// name of the HTTP header of the IETF draft and of Stripe, in gRPC's lower case.
	DefaultKeyMetadata = "idempotency-key"

	// DefaultReplayedMetadata is the response header metadata set to "true" on a replay.
	DefaultReplayedMetadata = "idempotent-replayed"

	DefaultMaxResponseBytes      = 4 << 20 // 4 MiB, gRPC's default limit on a received message
	DefaultUnavailableRetryDelay = 2 * time.Second
)

// Config configures [UnaryServerInterceptor]. Scope and Methods are required; every other zero
// value means the default named on the field.
//
//	intercept, err := idemgrpc.UnaryServerInterceptor(pool, &idemgrpc.Config{
//		Scope:         func(ctx context.Context) string { return "user:" + userID(ctx) },
//		Methods:       []string{"/bank.v1.Bank/*"},
//		ExceptMethods: []string{"/bank.v1.Bank/GetBalance"},
//		TTL:           48 * time.Hour,
//	})
type Config struct {
	// Scope returns the principal (tenant, user, API client) a call acts for, from the call's
	// context: put the interceptor after the one that authenticates. Keys are stored per scope,
	// so two principals never see or block each other's keys even when they pick the same key.
	// It is required: only the application knows who is calling. [MetadataScope] is there for
	// APIs where a metadata value such as an API key is the stable identity.
	//
	// Return "" when the call has no identity: a keyed call is then refused with
	// InvalidArgument (reason [ReasonScopeMissing]) and nothing runs, rather than landing in a
	// shared scope. An application that really wants anonymous keys returns a constant such as
	// "anonymous". The scope must be at most 255 bytes (hash longer identities); an invalid one
	// is a server error (Internal).
	Scope func(ctx context.Context) string

	// Methods names the unary methods guarded, by full name ("/bank.v1.Bank/Transfer"), or all
	// methods of a service ("/bank.v1.Bank/*"). Each must belong to a service registered with
	// the protobuf registry, as generated code does when its package is imported. Setup fails
	// for an unknown name, and for a streaming method: a stream's responses reach the client
	// before the transaction commits, so they cannot be stored and replayed. Calls of other
	// methods pass through untouched. Required.
	Methods []string

	// ExceptMethods leaves out methods that Methods includes, typically reads and streams of a
	// service named with "/…/*".
	ExceptMethods []string

	// KeyMetadata names the request metadata with the key. Default: [DefaultKeyMetadata].
	KeyMetadata string

	// ReplayedMetadata names the response header set to "true" on a replay. Default:
	// [DefaultReplayedMetadata].
	ReplayedMetadata string

	// RequireKey refuses a call of a guarded method without a key (InvalidArgument, reason
	// [ReasonKeyMissing]). Default: false (a call without a key passes through untouched).
	RequireKey bool

	// Fingerprint digests a request; see [FingerprintFunc]. Default: [DefaultFingerprint].
	Fingerprint FingerprintFunc

	// Store decides from the code of an error the handler returned whether the error is stored
	// (its transaction commits, and later calls with the key get the same error back, details
	// included) or not (its transaction rolls back, so a retry runs afresh). Errors with a code
	// that asks for a retry are never stored, whatever Store says: Unavailable, Internal,
	// Unknown, DeadlineExceeded, Aborted, ResourceExhausted and Canceled. Default: store every
	// other code.
	Store func(code codes.Code) bool

	// MaxResponseBytes caps the stored response: the encoded message or status plus the
	// metadata. A larger one is rolled back and answered Internal (reason
	// [ReasonResponseTooLarge]). Default: [DefaultMaxResponseBytes].
	MaxResponseBytes int

	// DropMetadata names more response metadata keys to leave out of what is stored and
	// replayed, beyond those that are always left out: pseudo-headers, "grpc-" keys, those
	// gRPC or HTTP/2 own (content-type, user-agent, te, connection and the other hop-by-hop
	// headers), date, and set-cookie.
	DropMetadata []string

	// UnavailableRetryDelay is the delay in the RetryInfo sent with Unavailable when the store
	// cannot be reached. Default: [DefaultUnavailableRetryDelay].
	UnavailableRetryDelay time.Duration

	// TTL is how long a stored answer is kept and replayed ([idem.TTL]); a retry after that
	// runs the handler again. Pick it longer than your clients keep retrying. Default:
	// [idem.DefaultTTL] (24 hours). It cannot be less than one second.
	TTL time.Duration

	// Wait makes a duplicate that arrives while the first call with its key is running wait up
	// to Wait and then get the first call's answer, instead of Aborted at once ([idem.Wait]). A
	// waiting call holds a connection. Default: 0, answer Aborted at once.
	Wait time.Duration

	// InFlightRetryDelay is the delay in the RetryInfo sent with Aborted when the key is in
	// flight: how long a client should wait before calling again ([idem.RetryAfter]). Default:
	// one second, which is also the least.
	InFlightRetryDelay time.Duration

	// Schema is the Postgres schema that holds idem's tables ([idem.Schema]); give idem.Migrate
	// the same. Default: "", unqualified, so that search_path decides.
	Schema string

	// Isolation is the isolation level of each call's transaction ([tx.Isolation]). Default:
	// the server's (normally READ COMMITTED).
	Isolation pgx.TxIsoLevel

	// MaxAttempts bounds how many times the interceptor runs a call's transaction, the first
	// time included, when Postgres aborts it with a serialization failure or deadlock or its
	// COMMIT's answer is lost ([tx.MaxAttempts]). Default: 10. 1 turns retrying off.
	MaxAttempts int

	// MinBackoff and MaxBackoff bound the random wait before running a transaction again
	// ([tx.Backoff]). Defaults: 5ms and 500ms (or MinBackoff, if that is more).
	MinBackoff, MaxBackoff time.Duration

	// TracerProvider and MeterProvider receive idem.Do's span and metrics for the guarded calls
	// ([idem.TracerProvider], [idem.MeterProvider]). Default: the global providers.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider

	// Logger receives server-side errors (a store failure, a misconfiguration). Default:
	// slog.Default(). A record names the call's key by its hash (key_hash), never by its ID, and
	// error texts have the ID replaced, unless RecordKeys is set.
	Logger *slog.Logger

	// RecordKeys makes spans and log records carry the key metadata's value as it is (idem.key.id
	// and id, and in error texts) instead of the short hash that stands for it by default
	// (idem.key.hash and key_hash; see idem.RecordKeys). For APIs whose keys are not secrets.
	// Metrics never carry keys.
	RecordKeys bool
}

// settings is a validated Config with defaults filled in.
type settings struct {
	Config
	keyOpts []idem.Option // the Config's fields for idem.Do
	txOpts  []tx.Option   // and for tx.Run
	keys    redact.Keys   // what records carry of keys
	methods map[string]*method
	dropped map[string]bool
}

// alwaysDropped are response metadata keys never stored: gRPC and HTTP/2 set them per response
// or per connection, a date belongs to one moment, and a cookie is usually a credential, which
// has no place in the database or in an answer to a call that may come from elsewhere.
var alwaysDropped = []string{
	"content-type", "user-agent", "te", "host", "content-length",
	"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
	"transfer-encoding", "trailer", "upgrade",
	"date", "set-cookie",
}

func newSettings(cfg *Config) (*settings, error) {
	if cfg == nil {
		return nil, errors.New("idemgrpc: Config cannot be nil: Scope and Methods are required")
	}
	s := &settings{Config: *cfg}
	c := &s.Config
	if c.Scope == nil {
		return nil, errors.New("idemgrpc: Scope cannot be nil: set it to a function that returns the principal a call acts for (see MetadataScope)")
	}
	var err error
	if s.methods, err = resolveMethods(c.Methods, c.ExceptMethods); err != nil {
		return nil, err
	}
	if c.KeyMetadata, err = metadataName("KeyMetadata", c.KeyMetadata, DefaultKeyMetadata); err != nil {
		return nil, err
	}
	if c.ReplayedMetadata, err = metadataName("ReplayedMetadata", c.ReplayedMetadata, DefaultReplayedMetadata); err != nil {
		return nil, err
	}
	if c.Fingerprint == nil {
		c.Fingerprint = DefaultFingerprint
	}
	if c.Store == nil {
		c.Store = func(codes.Code) bool { return true }
	}
	if c.MaxResponseBytes < 0 {
		return nil, fmt.Errorf("idemgrpc: MaxResponseBytes cannot be negative (got %d)", c.MaxResponseBytes)
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.UnavailableRetryDelay < 0 {
		return nil, fmt.Errorf("idemgrpc: UnavailableRetryDelay cannot be negative (got %s)", c.UnavailableRetryDelay)
	}
	if c.UnavailableRetryDelay == 0 {
		c.UnavailableRetryDelay = DefaultUnavailableRetryDelay
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	st := handlercfg.Store{TTL: c.TTL, Wait: c.Wait, InFlightRetryAfter: c.InFlightRetryDelay, Schema: c.Schema,
		Isolation: c.Isolation, MaxAttempts: c.MaxAttempts, MinBackoff: c.MinBackoff, MaxBackoff: c.MaxBackoff,
		TracerProvider: c.TracerProvider, MeterProvider: c.MeterProvider, RecordKeys: c.RecordKeys}
	s.keys = redact.Keys{Full: c.RecordKeys}
	if s.keyOpts, s.txOpts, err = st.Options("idemgrpc", "InFlightRetryDelay"); err != nil {
		return nil, err
	}
	c.InFlightRetryDelay, c.MinBackoff, c.MaxBackoff = st.InFlightRetryAfter, st.MinBackoff, st.MaxBackoff
	s.dropped = make(map[string]bool, len(alwaysDropped)+len(c.DropMetadata)+1)
	for _, k := range alwaysDropped {
		s.dropped[k] = true
	}
	for _, k := range c.DropMetadata {
		s.dropped[strings.ToLower(k)] = true
	}
	s.dropped[c.ReplayedMetadata] = true
	return s, nil
}

// metadataName validates a configured metadata key: gRPC keys are lower case, and the key must
// carry text, so "-bin" keys and gRPC's reserved "grpc-" prefix are refused.
func metadataName(field, name, def string) (string, error) {
	if name == "" {
		return def, nil
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return "", fmt.Errorf("idemgrpc: %s must be a lower-case metadata key of a-z, 0-9, '-', '_' and '.' (got %q)", field, name)
		}
	}
	if strings.HasSuffix(name, "-bin") || strings.HasPrefix(name, "grpc-") {
		return "", fmt.Errorf("idemgrpc: %s cannot end in -bin or begin with grpc- (got %q)", field, name)
	}
	return name, nil
}

// dropMetadata reports whether a response metadata key is left out of what is stored.
func (s *settings) dropMetadata(key string) bool {
	return s.dropped[key] || strings.HasPrefix(key, ":") || strings.HasPrefix(key, "grpc-")
}

// MetadataScope returns a Config.Scope that scopes keys by a request metadata value, such as an
// API key: the scope is the key's name and a SHA-256 digest of its value, so the credential
// itself is not stored. A call without the metadata, or with more than one value, has no scope
// (and is refused if it carries an idempotency key).
//
// Use it only for metadata that stays the same across retries of a call. A bearer token that is
// refreshed between a call and its retry would change the scope, and the retry would run again;
// scope by the user or client the token stands for instead.
//
//	cfg := &idemgrpc.Config{Scope: idemgrpc.MetadataScope("x-api-key"), Methods: methods}
func MetadataScope(name string) func(ctx context.Context) string {
	name = strings.ToLower(name)
	return func(ctx context.Context) string {
		vs := metadata.ValueFromIncomingContext(ctx, name)
		if len(vs) != 1 || vs[0] == "" {
			return ""
		}
		sum := sha256.Sum256([]byte(vs[0]))
		return name + ":" + hex.EncodeToString(sum[:])
	}
}
