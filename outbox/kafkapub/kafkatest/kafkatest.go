// Package kafkatest gives tests a Kafka: the brokers named by KAFKA_BROKERS (comma separated),
// or, with IDEM_KAFKA=container, a real Kafka in Docker through testcontainers, or else
// franz-go's in-process kfake cluster, which speaks Kafka's protocol with no server installed.
//
//	seeds := kafkatest.Seeds(t, "orders") // the topics to create
package kafkatest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// image is the Kafka the container path runs (KRaft, one node).
const image = "apache/kafka:3.9.1"

// Seeds returns seed brokers of a Kafka with topics made (three partitions each), for tb.
//
//	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkatest.Seeds(t, "events")...))
func Seeds(tb testing.TB, topics ...string) []string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var seeds []string
	switch {
	case os.Getenv("KAFKA_BROKERS") != "":
		seeds = strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
		tb.Log("kafkatest: Kafka from KAFKA_BROKERS")
	case os.Getenv("IDEM_KAFKA") == "container":
		s, stop, err := StartContainer(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(stop)
		seeds = s
		tb.Log("kafkatest: Kafka from a testcontainers " + image + " container")
	default:
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(c.Close)
		seeds = c.ListenAddrs()
		tb.Log("kafkatest: Kafka from franz-go's in-process kfake cluster")
	}
	if len(topics) > 0 {
		cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
		if err != nil {
			tb.Fatal(err)
		}
		defer cl.Close()
		if _, err := kadm.NewClient(cl).CreateTopics(ctx, 3, 1, nil, topics...); err != nil {
			tb.Fatalf("kafkatest: error creating topics: %v", err)
		}
	}
	return seeds
}

// StartContainer runs a one-node Kafka in Docker and returns its seed broker and a function that
// removes it.
//
//	seeds, stop, err := kafkatest.StartContainer(ctx)
func StartContainer(ctx context.Context) ([]string, func(), error) {
	ctr, err := testcontainers.Run(ctx, image, testcontainers.WithExposedPorts("9092/tcp"),
		testcontainers.WithWaitStrategy(wait.ForListeningPort("9092/tcp").WithStartupTimeout(2*time.Minute)))
	if err != nil {
		return nil, nil, fmt.Errorf("kafkatest: error starting a Kafka container: %w", err)
	}
	stop := func() { _ = testcontainers.TerminateContainer(ctr) }
	endpoint, err := ctr.PortEndpoint(ctx, "9092/tcp", "")
	if err != nil {
		stop()
		return nil, nil, err
	}
	return []string{endpoint}, stop, nil
}
