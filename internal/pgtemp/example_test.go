package pgtemp_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/pgtemp"
)

// Start finds or starts a Postgres for a program that has no DATABASE_URL.
// (No Output comment: the example is compiled but not run, since its output
// depends on the machine.)
func ExampleStart() {
	ctx := context.Background()
	srv, err := pgtemp.Start(ctx)
	if err != nil {
		log.Fatal(err) // Names everything that was tried.
	}
	defer srv.Close()

	dbURL, err := srv.CreateDatabase(ctx)
	if err != nil {
		log.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	fmt.Println("using", srv.Source())
}
