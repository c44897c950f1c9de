package idemgrpc_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem/idemgrpc"
)

// nopBeginner stands in for a pool where setup must fail before any use of it.
type nopBeginner struct{}

func (nopBeginner) Begin(context.Context) (pgx.Tx, error) { panic("setup must not begin") }

func TestSetup(t *testing.T) {
	t.Parallel()

	t.Run("ServerConfig", func(t *testing.T) {
		t.Parallel()
		_, err := idemgrpc.UnaryServerInterceptor(nil, config())
		require.ErrorContains(t, err, "db cannot be nil")
		_, err = idemgrpc.UnaryServerInterceptor(nopBeginner{}, nil)
		require.ErrorContains(t, err, "Config cannot be nil")

		for name, tc := range map[string]struct {
			edit func(*idemgrpc.Config)
			want string
		}{
			"NoScope":           {func(c *idemgrpc.Config) { c.Scope = nil }, "Scope cannot be nil"},
			"NoMethods":         {func(c *idemgrpc.Config) { c.Methods = nil }, "Methods cannot be empty"},
			"BareName":          {func(c *idemgrpc.Config) { c.Methods = []string{"Record"} }, `of the form "/package.Service/Method" or "/package.Service/*" (got "Record")`},
			"NoSlash":           {func(c *idemgrpc.Config) { c.Methods = []string{"idemgrpc.test.v1.Ledger/Record"} }, "full method names"},
			"ExtraSlash":        {func(c *idemgrpc.Config) { c.Methods = []string{recordMethod + "/x"} }, "full method names"},
			"UnknownService":    {func(c *idemgrpc.Config) { c.Methods = []string{"/no.such.Service/Do"} }, "no service no.such.Service is registered"},
			"NotAService":       {func(c *idemgrpc.Config) { c.Methods = []string{"/idemgrpc.test.v1.RecordRequest/Do"} }, "is not a service"},
			"UnknownMethod":     {func(c *idemgrpc.Config) { c.Methods = []string{"/idemgrpc.test.v1.Ledger/Erase"} }, "has no method Erase"},
			"Streaming":         {func(c *idemgrpc.Config) { c.Methods = []string{followMethod} }, "cannot include streaming methods (/idemgrpc.test.v1.Ledger/Follow)"},
			"StreamingWildcard": {func(c *idemgrpc.Config) { c.Methods = []string{"/idemgrpc.test.v1.Ledger/*"} }, "cannot include streaming methods (/idemgrpc.test.v1.Ledger/Follow)"},
			"ExceptNotIncluded": {func(c *idemgrpc.Config) { c.ExceptMethods = []string{lookupMethod} }, `ExceptMethods names "/idemgrpc.test.v1.Ledger/Lookup", which Methods does not include`},
			"ExceptMalformed":   {func(c *idemgrpc.Config) { c.ExceptMethods = []string{"/x/*"} }, "ExceptMethods must hold full method names"},
			"KeyUpperCase":      {func(c *idemgrpc.Config) { c.KeyMetadata = "Idempotency-Key" }, "KeyMetadata must be a lower-case metadata key"},
			"KeyBinary":         {func(c *idemgrpc.Config) { c.KeyMetadata = "idempotency-key-bin" }, "KeyMetadata cannot end in -bin"},
			"ReplayedReserved":  {func(c *idemgrpc.Config) { c.ReplayedMetadata = "grpc-replayed" }, "ReplayedMetadata cannot end in -bin or begin with grpc-"},
			"NegativeMax":       {func(c *idemgrpc.Config) { c.MaxResponseBytes = -1 }, "MaxResponseBytes cannot be negative"},
			"NegativeDelay":     {func(c *idemgrpc.Config) { c.UnavailableRetryDelay = -time.Second }, "UnavailableRetryDelay cannot be negative"},
		} {
			cfg := config()
			tc.edit(cfg)
			_, err := idemgrpc.UnaryServerInterceptor(nopBeginner{}, cfg)
			require.ErrorContains(t, err, tc.want, name)
			require.ErrorContains(t, err, "idemgrpc: ", name)
		}

		cfg := config()
		cfg.Methods = []string{"/idemgrpc.test.v1.Ledger/*"}
		cfg.ExceptMethods = []string{followMethod}
		_, err = idemgrpc.UnaryServerInterceptor(nopBeginner{}, cfg)
		require.NoError(t, err, "a wildcard with the stream left out")
	})

	t.Run("MetadataScope", func(t *testing.T) {
		t.Parallel()
		scope := idemgrpc.MetadataScope("X-Api-Key")
		sum := sha256.Sum256([]byte("secret"))
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "secret"))
		require.Equal(t, "x-api-key:"+hex.EncodeToString(sum[:]), scope(ctx))
		require.Empty(t, scope(context.Background()))
		two := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "a", "x-api-key", "b"))
		require.Empty(t, scope(two), "two values are no identity")
	})
}
