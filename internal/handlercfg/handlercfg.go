// Package handlercfg turns the store settings that idemhttp and idemgrpc both offer as plain
// Config fields into the idem and tx options they run each request with, checked the same way,
// so that the two layers cannot drift apart.
package handlercfg

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/tx"
)

// Defaults of the backoff between runs of a request's transaction.
const (
	DefaultMinBackoff = 5 * time.Millisecond
	DefaultMaxBackoff = 500 * time.Millisecond
)

// Store is the settings a layer's Config carries for idem.Do and tx.Run; see idemhttp.Config
// for what each means.
type Store struct {
	TTL, Wait, InFlightRetryAfter time.Duration
	Schema                        string
	Isolation                     pgx.TxIsoLevel
	MaxAttempts                   int
	MinBackoff, MaxBackoff        time.Duration
	TracerProvider                trace.TracerProvider
	MeterProvider                 metric.MeterProvider
	RecordKeys                    bool
}

// Options checks s, fills in the defaults of InFlightRetryAfter, MinBackoff and MaxBackoff,
// and returns the options for idem.Do and tx.Run. Errors start with pkg and name the field as
// the layer's Config does (inFlight is that field's name).
func (s *Store) Options(pkg, inFlight string) ([]idem.Option, []tx.Option, error) {
	switch {
	case s.TTL != 0 && s.TTL < time.Second:
		return nil, nil, fmt.Errorf("%s: TTL cannot be less than one second (got %s)", pkg, s.TTL)
	case s.Wait < 0:
		return nil, nil, fmt.Errorf("%s: Wait cannot be negative (got %s)", pkg, s.Wait)
	case s.InFlightRetryAfter != 0 && s.InFlightRetryAfter < time.Second:
		return nil, nil, fmt.Errorf("%s: %s cannot be less than one second (got %s)", pkg, inFlight, s.InFlightRetryAfter)
	case len(s.Schema) > 63:
		return nil, nil, fmt.Errorf("%s: Schema cannot be longer than 63 bytes, Postgres's limit for a name (got %d bytes)", pkg, len(s.Schema))
	case s.MaxAttempts < 0:
		return nil, nil, fmt.Errorf("%s: MaxAttempts cannot be negative (got %d)", pkg, s.MaxAttempts)
	case s.MinBackoff < 0:
		return nil, nil, fmt.Errorf("%s: MinBackoff cannot be negative (got %s)", pkg, s.MinBackoff)
	case s.MaxBackoff < 0:
		return nil, nil, fmt.Errorf("%s: MaxBackoff cannot be negative (got %s)", pkg, s.MaxBackoff)
	case s.MaxBackoff != 0 && s.MaxBackoff < s.MinBackoff:
		return nil, nil, fmt.Errorf("%s: MaxBackoff cannot be less than MinBackoff (got %s and %s)", pkg, s.MaxBackoff, s.MinBackoff)
	}
	switch s.Isolation {
	case "", pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable:
	default:
		return nil, nil, fmt.Errorf("%s: Isolation must be one of pgx.ReadCommitted, pgx.RepeatableRead and pgx.Serializable (got %q)", pkg, s.Isolation)
	}
	var keyOpts []idem.Option
	var txOpts []tx.Option
	if s.TTL != 0 {
		keyOpts = append(keyOpts, idem.TTL(s.TTL))
	}
	if s.Wait != 0 {
		keyOpts = append(keyOpts, idem.Wait(s.Wait))
	}
	if s.InFlightRetryAfter == 0 {
		s.InFlightRetryAfter = time.Second
	}
	keyOpts = append(keyOpts, idem.RetryAfter(s.InFlightRetryAfter), idem.TracerProvider(s.TracerProvider), idem.MeterProvider(s.MeterProvider))
	if s.Schema != "" {
		keyOpts = append(keyOpts, idem.Schema(s.Schema))
	}
	if s.RecordKeys {
		keyOpts = append(keyOpts, idem.RecordKeys())
	}
	if s.Isolation != "" {
		txOpts = append(txOpts, tx.Isolation(s.Isolation))
	}
	if s.MaxAttempts != 0 {
		txOpts = append(txOpts, tx.MaxAttempts(s.MaxAttempts))
	}
	if s.MinBackoff == 0 {
		s.MinBackoff = DefaultMinBackoff
	}
	if s.MaxBackoff == 0 {
		s.MaxBackoff = max(DefaultMaxBackoff, s.MinBackoff)
	}
	txOpts = append(txOpts, tx.Backoff(s.MinBackoff, s.MaxBackoff))
	return keyOpts, txOpts, nil
}
