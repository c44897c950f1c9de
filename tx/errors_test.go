package tx_test

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/tx"
)

func TestIsConnectionLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Severity: "FATAL", Code: "57P01"}, true},
		{fmt.Errorf("error beginning transaction: %w", &pgconn.PgError{Severity: "ERROR", Code: "57P01"}), true},
		{&pgconn.PgError{Severity: "ERROR", Code: "08006"}, true},
		{fmt.Errorf("step: %w", io.ErrUnexpectedEOF), true},
		{pgconn.ErrConnClosed, true},
		{&pgconn.PgError{Severity: "ERROR", Code: "23505"}, false},
		{&pgconn.PgError{Severity: "ERROR", Code: "40001"}, false},
		{errors.New("insufficient funds"), false},
	} {
		require.Equal(t, tc.want, tx.IsConnectionLost(tc.err), "%v", tc.err)
	}
}
