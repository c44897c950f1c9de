package idem_test

import (
	"context"
	"fmt"
	"log"

	"github.com/idemkit/idem"
)

func ExampleKeyResult() {
	ctx := context.Background()
	pool := examplePool()
	defer pool.Close()

	key := idem.Key{Scope: "customer:42", ID: "order-7f3a"}
	if _, err := idem.Run(ctx, pool, key, placeOrder("book")); err != nil {
		log.Fatal(err)
	}
	// What a replay decodes: the client's answer, for an operator allowed to see it.
	result, err := idem.KeyResult(ctx, pool, key)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(result))
	// Output:
	// {"id":1,"item":"book"}
}
