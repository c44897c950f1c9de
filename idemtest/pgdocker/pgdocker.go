// Package pgdocker lets idemtest (and idem's own tests) start their throwaway Postgres in a
// container, on a Docker engine, through testcontainers-go. It is a module of its own, so that
// Docker's client modules (testcontainers, moby, docker) stay out of the go.mod of every module
// that imports idemtest without it: the local Postgres binaries and TEST_DATABASE_URL need none of
// them.
//
// Opt in by importing it, for its effect only, in a test file of each package whose tests should
// use a Docker engine:
//
//	import (
//		"github.com/idemkit/idem/idemtest"
//		_ "github.com/idemkit/idem/idemtest/pgdocker" // Postgres in a container when Docker answers
//	)
//
//	func TestMain(m *testing.M) { os.Exit(idemtest.Main(m)) }
//
// idemtest then finds a Postgres in this order: TEST_DATABASE_URL; a postgres:16-alpine container,
// when a Docker engine answers a ping within about 1.5 seconds (DOCKER_HOST, else the sockets
// testcontainers-go looks at); the local Postgres binaries. The container gets the same
// test-friendly settings as the local binaries (durability off, its data on a tmpfs), and
// testcontainers-go's reaper removes it if the test binary dies.
package pgdocker

import (
	"context"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/idemkit/idem/internal/pgtemp"
)

// Image is the container image of the Postgres it starts.
//
//	log.Printf("tests run on %s", pgdocker.Image)
const Image = "postgres:16-alpine"

func init() { pgtemp.RegisterContainers(start) }

// start runs Image with settings (as postgres -c arguments), its data on a tmpfs since it is
// thrown away anyway.
func start(ctx context.Context, host string, settings []string) (rawURL, detail string, stop func() error, err error) {
	args := []string{"postgres"}
	for _, kv := range settings {
		args = append(args, "-c", kv)
	}
	ctr, err := tcpostgres.Run(ctx, Image,
		tcpostgres.BasicWaitStrategies(),
		testcontainers.WithCmd(args...),
		testcontainers.WithTmpfs(map[string]string{"/var/lib/postgresql/data": "rw"}),
	)
	stop = func() error { return stopContainer(ctr) }
	if err != nil {
		if ctr != nil {
			_ = stop()
		}
		return "", "", nil, fmt.Errorf("error starting container: %w", err)
	}
	raw, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = stop()
		return "", "", nil, fmt.Errorf("error getting container address: %w", err)
	}
	return raw, Image + " via " + host, stop, nil
}

func stopContainer(ctr *tcpostgres.PostgresContainer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// No grace period: the data is throwaway.
	if err := testcontainers.TerminateContainer(ctr, testcontainers.StopContext(ctx), testcontainers.StopTimeout(0)); err != nil {
		return fmt.Errorf("error stopping container: %w", err)
	}
	return nil
}
