package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/idemkit/idem"
)

func ExampleKeyGet() {
	ctx := context.Background()
	pool := examplePool()
	defer pool.Close()

	key := idem.Key{Scope: "customer:42", ID: "order-7f3a"}
	if _, err := idem.Run(ctx, pool, key, placeOrder("book")); err != nil {
		log.Fatal(err)
	}
	info, err := idem.KeyGet(ctx, pool, key)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("stored: %d bytes, expired: %v, run: %q\n", info.ResultSize, info.Expired, info.Workflow)

	_, err = idem.KeyGet(ctx, pool, idem.Key{Scope: "customer:42", ID: "never-used"})
	fmt.Println("never used:", errors.Is(err, idem.ErrNotFound))
	// Output:
	// stored: 22 bytes, expired: false, run: ""
	// never used: true
}

func ExampleKeyDelete() {
	ctx := context.Background()
	pool := examplePool()
	defer pool.Close()

	key := idem.Key{Scope: "customer:42", ID: "order-7f3a"}
	first, err := idem.Run(ctx, pool, key, placeOrder("book"))
	if err != nil {
		log.Fatal(err)
	}
	// The stored answer was wrong: forget it, and the same key runs again.
	if err := idem.KeyDelete(ctx, pool, key); err != nil {
		log.Fatal(err)
	}
	second, err := idem.Run(ctx, pool, key, placeOrder("book"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("first order %d, after KeyDelete order %d\n", first.ID, second.ID)
	// Output:
	// first order 1, after KeyDelete order 2
}

func ExampleKeyList() {
	ctx := context.Background()
	pool := examplePool()
	defer pool.Close()

	for _, id := range []string{"order-1", "order-2", "order-3", "refund-1"} {
		if _, err := idem.Run(ctx, pool, idem.Key{Scope: "customer:42", ID: id}, placeOrder(id)); err != nil {
			log.Fatal(err)
		}
	}
	// Which orders did the client send? Two to a page.
	params := &idem.KeyListParams{Scope: "customer:42", Prefix: "order-", Limit: 2}
	for {
		page, err := idem.KeyList(ctx, pool, params)
		if err != nil {
			log.Fatal(err)
		}
		for _, k := range page.Keys {
			fmt.Println(k.ID, k.Expired)
		}
		if page.Next == "" {
			break
		}
		params.After = page.Next
	}
	// Output:
	// order-1 false
	// order-2 false
	// order-3 false
}
