// Command idem is idem's operator command line: it migrates the schema, reads and forgets keys of
// idem.Do, lists, shows, cancels, resumes, forks and exports workflow runs, steers schedules, and
// reaps what has expired. It is package idemcli built with no workflows; see there for every
// command and flag, and for building the command into an application, with its workflows, for
// idem runs check.
//
//	idem migrate
//	idem runs list --state failed --since 24h
//	idem runs show merchant:7 payout-1
package main

import (
	"context"
	"os"

	"github.com/idemkit/idem/idemcli"
)

func main() {
	os.Exit(idemcli.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr, nil))
}
