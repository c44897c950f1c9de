package idemhttp

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/handlercfg"
	"github.com/idemkit/idem/internal/redact"
	"github.com/idemkit/idem/tx"
)

// Defaults used for the zero values of [Config].
const (
	DefaultMaxBodyBytes     = 1 << 20 // 1 MiB
	DefaultMaxResponseBytes = 4 << 20 // 4 MiB
	DefaultUnavailableRetry = 2 * time.Second
)

// DefaultMethods returns the methods the middleware guards, and the Transport keys, by default:
// POST and PATCH. GET, PUT and DELETE are idempotent by definition in HTTP and need no key. It
// returns a new slice on every call, so a caller may append to it.
//
//	cfg.Methods = append(idemhttp.DefaultMethods(), http.MethodDelete)
func DefaultMethods() []string { return []string{http.MethodPost, http.MethodPatch} }

// Config configures [Middleware]. Scope is required; every other zero value means the default
// named on the field. Middleware checks every field when it is called and returns an error that
// names a bad one, so a wrong setting fails at start-up, not on the first request.
//
//	mw, err := idemhttp.Middleware(pool, &idemhttp.Config{
//		Scope:      func(r *http.Request) string { return "user:" + userID(r.Context()) },
//		RequireKey: true,
//		TTL:        48 * time.Hour,
//	})
type Config struct {
	// Scope returns the principal (tenant, user, API client) a request acts for. Keys are
	// stored per scope, so two principals never see or block each other's keys even when they
	// pick the same key. It is required: only the application knows who is calling, and a guess
	// (say, a digest of the Authorization header) would silently run a retry twice once a
	// bearer token is refreshed. [HeaderScope] is there for APIs where a header such as an API
	// key is the stable identity.
	//
	// Return "" when the request has no identity: a keyed request is then answered 400
	// (idempotency-scope-missing) and nothing runs, rather than landing in a shared scope. An
	// application that really wants anonymous keys returns a constant such as "anonymous". The
	// scope must be at most 255 bytes (hash longer identities); an invalid one is a server error
	// (500).
	Scope func(r *http.Request) string

	// Methods are the methods guarded; requests with any other method pass through untouched.
	// Default: [DefaultMethods] (POST and PATCH).
	Methods []string

	// KeyHeader names the request header with the key. Default: [DefaultKeyHeader].
	KeyHeader string

	// ReplayedHeader names the response header set to "true" on a replay. Default:
	// [DefaultReplayedHeader].
	ReplayedHeader string

	// RequireKey makes a guarded request without a key an error (400, idempotency-key-missing)
	// on every route; a [RouteConfig] can override it per route. Default: false (a request
	// without a key passes through untouched).
	RequireKey bool

	// Fingerprint digests a request; see [FingerprintFunc]. Default: [DefaultFingerprint].
	Fingerprint FingerprintFunc

	// Store decides from the handler's status whether its response is stored (its transaction
	// committed, and later requests with the key replay it) or not stored (its transaction
	// rolled back, so a retry runs afresh). A 5xx is never stored, whatever Store says: the
	// client's retry must get a real second chance. Default: store every status below 500.
	Store func(status int) bool

	// MismatchStatus is the status for a key reused with a different request:
	// http.StatusUnprocessableEntity (422, the IETF draft's choice, the default) or
	// http.StatusBadRequest (400, Stripe's).
	MismatchStatus int

	// MaxBodyBytes caps the request body the middleware reads (it must read all of it to
	// fingerprint it and to run the handler again on a retry). A larger body is answered 413 and
	// nothing runs. Default: [DefaultMaxBodyBytes].
	MaxBodyBytes int64

	// MaxResponseBytes caps the response the middleware buffers and stores: its body and the
	// headers that are stored (each value with its name, as on the wire). A handler writing more
	// gets an error from Write; its transaction is rolled back and the client gets a 500
	// (response-too-large). Default: [DefaultMaxResponseBytes].
	MaxResponseBytes int64

	// ReplaySetCookie stores and replays Set-Cookie headers, as StoreCredentialHeaders naming
	// Set-Cookie does. Off by default: a cookie is usually a session credential, which has no
	// place in the database or in a response to a request that may come from elsewhere.
	ReplaySetCookie bool

	// StoreCredentialHeaders names response headers of [CredentialHeaders] (Authorization,
	// Set-Cookie, ...) to store and replay after all. By default none is: a stored response is
	// replayed, for the TTL, to whoever sends its key in its scope. Names are case-insensitive;
	// one that is not a credential header is an error.
	StoreCredentialHeaders []string

	// DropHeaders names more response headers to leave out of the stored response, beyond
	// hop-by-hop headers, Date and Content-Length (always left out) and Set-Cookie (see
	// ReplaySetCookie).
	DropHeaders []string

	// UnavailableRetryAfter is the Retry-After sent with a 503 when the store cannot be
	// reached. Default: [DefaultUnavailableRetry].
	UnavailableRetryAfter time.Duration

	// Route returns the per-route configuration for a request, or nil for the defaults above.
	// Use it when the middleware wraps a whole router; see [Route] for the other way.
	Route func(r *http.Request) *RouteConfig

	// Redact changes what is stored of a response before it is stored; see [Redactor]. A
	// [RouteConfig] can set its own. Default: nil, store the response as the client gets it.
	Redact Redactor

	// TTL is how long a stored response is kept and replayed ([idem.TTL]); a retry after that
	// runs the handler again. Pick it longer than your clients keep retrying. Default:
	// [idem.DefaultTTL] (24 hours). It cannot be less than one second.
	TTL time.Duration

	// Wait makes a duplicate that arrives while the first request with its key is running wait
	// up to Wait and then get the first request's response, instead of a 409 at once
	// ([idem.Wait]). A waiting request holds a connection. Default: 0, answer 409 at once.
	Wait time.Duration

	// InFlightRetryAfter is the Retry-After of a 409 (idempotency-key-in-flight): how long a
	// client should wait before asking again ([idem.RetryAfter]). Default: one second, which is
	// also the least.
	InFlightRetryAfter time.Duration

	// Schema is the Postgres schema that holds idem's tables ([idem.Schema]); give idem.Migrate
	// the same. Default: "", unqualified, so that search_path decides.
	Schema string

	// Isolation is the isolation level of each request's transaction ([tx.Isolation]). Default:
	// the server's (normally READ COMMITTED).
	Isolation pgx.TxIsoLevel

	// MaxAttempts bounds how many times the middleware runs a request's transaction, the first
	// time included, when Postgres aborts it with a serialization failure or deadlock or its
	// COMMIT's answer is lost ([tx.MaxAttempts]). Default: 10. 1 turns retrying off.
	MaxAttempts int

	// MinBackoff and MaxBackoff bound the random wait before running a transaction again
	// ([tx.Backoff]). Defaults: 5ms and 500ms (or MinBackoff, if that is more).
	MinBackoff, MaxBackoff time.Duration

	// ProblemTypeBase starts the type URI of the middleware's problems. Default:
	// [DefaultProblemTypeBase].
	ProblemTypeBase string

	// Logger receives server-side errors (a misconfiguration, a failed transaction) and, at
	// warn level, what clients cannot see: the store unavailable, a race for a key that
	// survived every retry. Default: slog.Default(). A record names the request's key by its
	// hash (key_hash), never by its ID, and error texts have the ID replaced, unless RecordKeys
	// is set.
	Logger *slog.Logger

	// TracerProvider receives a span per guarded request, "idemhttp.request" (attributes
	// idem.outcome: run, replay, in_flight, mismatch, refused, error, unavailable;
	// idem.replayed; http.response.status_code; idem.scope; idem.key.hash), with idem.Do's span
	// inside it. Default: the global provider, which discards spans until the application
	// installs an SDK.
	TracerProvider trace.TracerProvider

	// RecordKeys makes spans and log records carry the Idempotency-Key's value as it is
	// (idem.key.id and id, and in error texts) instead of the short hash that stands for it by
	// default (idem.key.hash and key_hash; see idem.RecordKeys). For APIs whose keys are not
	// secrets. Metrics never carry keys.
	RecordKeys bool

	// MeterProvider receives idem.Do's metrics for the guarded requests (see
	// idem.MeterProvider). Default: the global provider.
	MeterProvider metric.MeterProvider
}

// KeyPolicy says whether a route requires an idempotency key.
//
//	idemhttp.Route(&idemhttp.RouteConfig{Key: idemhttp.KeyRequired}, createPayment)
type KeyPolicy int

const (
	// KeyDefault follows Config.RequireKey.
	KeyDefault KeyPolicy = iota
	// KeyOptional guards requests that carry a key and passes the others through.
	KeyOptional
	// KeyRequired answers 400 to a guarded request without a key.
	KeyRequired
)

// RouteConfig overrides parts of [Config] for one route. Zero fields inherit the Config's.
//
//	payments := idemhttp.Route(&idemhttp.RouteConfig{Key: idemhttp.KeyRequired}, paymentsHandler)
type RouteConfig struct {
	// Key says whether the route requires a key.
	Key KeyPolicy

	// Fingerprint replaces Config.Fingerprint for the route, for a body whose equivalence
	// JSON canonicalisation does not capture (a form, a protobuf).
	Fingerprint FingerprintFunc

	// Store replaces Config.Store for the route. 5xx is still never stored.
	Store func(status int) bool

	// Redact replaces Config.Redact for the route, for a route whose response carries a secret
	// shown once (an API key at creation, say).
	Redact Redactor
}

// settings is a validated Config with defaults filled in.
type settings struct {
	Config
	methods        map[string]bool
	dropExtra      map[string]bool
	keepCredential map[string]bool
	keyOpts        []idem.Option // the Config's fields for idem.Do
	txOpts         []tx.Option   // and for tx.Run
	keys           redact.Keys   // what records carry of keys
}

func newSettings(cfg *Config) (*settings, error) {
	if cfg == nil {
		return nil, errors.New("idemhttp: Config cannot be nil: Scope is required")
	}
	s := &settings{Config: *cfg}
	c := &s.Config
	if c.Scope == nil {
		return nil, errors.New("idemhttp: Scope cannot be nil: set it to a function that returns the principal a request acts for (see HeaderScope)")
	}
	if len(c.Methods) == 0 {
		c.Methods = DefaultMethods()
	}
	s.methods = make(map[string]bool, len(c.Methods))
	for _, m := range c.Methods {
		if m == "" || strings.ToUpper(m) != m {
			return nil, fmt.Errorf("idemhttp: Methods must be upper-case method names (got %q)", m)
		}
		s.methods[m] = true
	}
	if c.KeyHeader == "" {
		c.KeyHeader = DefaultKeyHeader
	}
	if c.ReplayedHeader == "" {
		c.ReplayedHeader = DefaultReplayedHeader
	}
	if c.Fingerprint == nil {
		c.Fingerprint = DefaultFingerprint
	}
	if c.Store == nil {
		c.Store = func(status int) bool { return status < 500 }
	}
	switch c.MismatchStatus {
	case 0:
		c.MismatchStatus = http.StatusUnprocessableEntity
	case http.StatusUnprocessableEntity, http.StatusBadRequest:
	default:
		return nil, fmt.Errorf("idemhttp: MismatchStatus must be 422 or 400 (got %d)", c.MismatchStatus)
	}
	if c.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("idemhttp: MaxBodyBytes cannot be negative (got %d)", c.MaxBodyBytes)
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxResponseBytes < 0 {
		return nil, fmt.Errorf("idemhttp: MaxResponseBytes cannot be negative (got %d)", c.MaxResponseBytes)
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.UnavailableRetryAfter < 0 {
		return nil, fmt.Errorf("idemhttp: UnavailableRetryAfter cannot be negative (got %s)", c.UnavailableRetryAfter)
	}
	if c.UnavailableRetryAfter == 0 {
		c.UnavailableRetryAfter = DefaultUnavailableRetry
	}
	if c.ProblemTypeBase == "" {
		c.ProblemTypeBase = DefaultProblemTypeBase
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	s.dropExtra = make(map[string]bool, len(c.DropHeaders))
	for _, h := range c.DropHeaders {
		s.dropExtra[textproto.CanonicalMIMEHeaderKey(h)] = true
	}
	s.keepCredential = map[string]bool{}
	if c.ReplaySetCookie {
		s.keepCredential["Set-Cookie"] = true
	}
	for _, h := range c.StoreCredentialHeaders {
		name := textproto.CanonicalMIMEHeaderKey(h)
		if !credentialHeaders[name] {
			return nil, fmt.Errorf("idemhttp: StoreCredentialHeaders names %q, which is not one of CredentialHeaders (%s); headers that are stored anyway need no setting", h, strings.Join(CredentialHeaders(), ", "))
		}
		s.keepCredential[name] = true
	}
	if err := s.storeOptions(); err != nil {
		return nil, err
	}
	return s, nil
}

// storeOptions checks the fields passed on to idem.Do and tx.Run, by the rules those apply, and
// turns them into their options: an error here names the Config field, where one from idem or
// tx at request time would be a 503 on every request.
func (s *settings) storeOptions() error {
	c := &s.Config
	st := handlercfg.Store{TTL: c.TTL, Wait: c.Wait, InFlightRetryAfter: c.InFlightRetryAfter, Schema: c.Schema,
		Isolation: c.Isolation, MaxAttempts: c.MaxAttempts, MinBackoff: c.MinBackoff, MaxBackoff: c.MaxBackoff,
		TracerProvider: c.TracerProvider, MeterProvider: c.MeterProvider, RecordKeys: c.RecordKeys}
	s.keys = redact.Keys{Full: c.RecordKeys}
	var err error
	if s.keyOpts, s.txOpts, err = st.Options("idemhttp", "InFlightRetryAfter"); err != nil {
		return err
	}
	c.InFlightRetryAfter, c.MinBackoff, c.MaxBackoff = st.InFlightRetryAfter, st.MinBackoff, st.MaxBackoff
	return nil
}

// route is the configuration in force for one request.
type route struct {
	rc          *RouteConfig // nil when none applies; compared by identity in Route
	required    bool
	fingerprint FingerprintFunc
	store       func(int) bool
	redact      Redactor
}

func (s *settings) resolve(rc *RouteConfig) route {
	rt := route{rc: rc, required: s.RequireKey, fingerprint: s.Fingerprint, store: s.Store, redact: s.Redact}
	if rc == nil {
		return rt
	}
	switch rc.Key {
	case KeyOptional:
		rt.required = false
	case KeyRequired:
		rt.required = true
	}
	if rc.Fingerprint != nil {
		rt.fingerprint = rc.Fingerprint
	}
	if rc.Store != nil {
		rt.store = rc.Store
	}
	if rc.Redact != nil {
		rt.redact = rc.Redact
	}
	return rt
}
