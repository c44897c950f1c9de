// Package idemcli is idem's operator command line (cmd/idem is it, built with no workflows): it
// migrates the schema, reads, lists and forgets keys of idem.Do, lists, shows, cancels,
// resumes, forks and exports workflow runs, checks stored runs against workflow code, lists,
// pauses, resumes, triggers, backfills and deletes schedules, lists, shows, retries and skips
// outbox messages, reaps what has expired, and serves the web view (idem ui, package idemui). It
// is a thin shell over the library's own functions (idem.KeyGet, idem.KeyList, Engine.RunList,
// Engine.RunCancel, ...), so it does exactly what a program calling them would.
//
//	idem migrate
//	idem keys get customer:42 order-7f3a
//	idem keys list --scope customer:42 --prefix order-
//	idem runs list --state failed --since 24h
//	idem runs show merchant:7 payout-1
//	idem runs resume merchant:7 payout-1
//	idem runs list --attr customer=c-42
//	idem runs export --state running,sleeping,awaiting > runs.json
//	idem schedules pause nightly-settlement --note "bank holiday"
//	idem outbox list --status stopped
//	idem outbox retry 01937b9e-5a4c-7c3e-9b6e-2f1d4c5a6b7c
//	idem ui --listen 127.0.0.1:8081 --basic-auth ops:secret --allow-actions
//
// An application builds its own command with its workflows in it, for idem runs check, which
// replays stored runs against the code (Config.Workflows), and is the stock command otherwise:
//
//	func main() {
//		os.Exit(idemcli.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr,
//			&idemcli.Config{Workflows: []workflow.Definition{payouts.Payout, payouts.Refund}}))
//	}
//
// Every command takes --database-url (default $DATABASE_URL), --schema (idem's Postgres schema,
// as given to idem.Migrate) and --json (machine-readable output instead of aligned tables), and
// --help. Exit codes: 0 success, 1 the operation failed (the message is on stderr), 2 the
// command line was wrong.
//
// Tables show stored strings (error texts, workflow names, scopes, inputs) with the characters a
// terminal would act on escaped as Go escapes them (\x1b, \u202e) and long ones clipped; --json
// shows them whole. Fingerprints are hex in both.
//
// It needs no workflow definitions but for runs check: runs are read and changed in the database,
// and resume, fork and a schedule's trigger and backfill insert River jobs that the application's
// own River client works. So River's tables must be migrated (rivermigrate) before those are
// used, and --queue must name a queue the
// application works, if its engine uses another than River's default.
//
// The standard flag package parses the command line: a handful of subcommands with a few flags
// each do not need a CLI framework, and a dependency in every build of the library's module
// would cost more than the few lines of dispatch here. Flags may come before or after the
// positional arguments.
package idemcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/workflow"
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

// Config is what an application builds into its own idem command. nil is the stock command.
//
//	cfg := &idemcli.Config{Workflows: []workflow.Definition{payouts.Payout}}
type Config struct {
	// Workflows are the application's workflows, which idem runs check replays stored runs
	// against. Without them, runs check says how to build a command that has them.
	Workflows []workflow.Definition
}

// Main runs the command line args (without the program's name), writing to stdout and stderr,
// and returns the exit code: 0 success, 1 the operation failed, 2 the command line was wrong.
//
//	func main() { os.Exit(idemcli.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr, nil)) }
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, cfg *Config) int {
	if cfg == nil {
		cfg = &Config{}
	}
	return run(ctx, args, stdout, stderr, cfg)
}

// command is one subcommand, such as "runs list".
type command struct {
	name    string
	args    []string // names of the positional arguments
	summary string
	help    string // more about what it does
	flags   func(fs *flag.FlagSet, c *call)
	run     func(ctx context.Context, c *call) error
}

// call is one invocation: the parsed command line, and where output goes.
type call struct {
	cmd            *command
	args           []string
	stdout, stderr io.Writer
	cfg            *Config
	databaseURL    string
	schema         string
	json           bool
	pool           *pgxpool.Pool // from connect, closed by run

	// Flags of some commands.
	to          *int // nil: the latest
	reason      string
	queue       string
	riverSchema string
	fromStep    int
	newScope    string
	file        string // runs export --out, runs check --file
	list        listFlags
	sched       scheduleFlags
	keyList     keyListFlags
	outbox      outboxFlags
	ui          uiFlags
}

// usageError is a wrong command line: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

var commands = []*command{migrateCmd, keysGetCmd, keysListCmd, keysDeleteCmd, runsListCmd, runsShowCmd, runsCancelCmd, runsResumeCmd, runsForkCmd, runsExportCmd, runsCheckCmd, reapCmd,
	schedulesListCmd, schedulesShowCmd, schedulesPauseCmd, schedulesResumeCmd, schedulesTriggerCmd, schedulesBackfillCmd, schedulesDeleteCmd,
	outboxListCmd, outboxShowCmd, outboxRetryCmd, outboxSkipCmd, uiCmd}

func run(ctx context.Context, argv []string, stdout, stderr io.Writer, cfg *Config) int {
	if len(argv) == 0 {
		usage(stderr)
		return exitUsage
	}
	if argv[0] == "--version" || argv[0] == "-version" || argv[0] == "version" {
		fmt.Fprintln(stdout, versionLine())
		return exitOK
	}
	if isHelp(argv[0]) || argv[0] == "help" {
		// "idem help runs list" is "idem runs list --help"; "idem help runs", the group's list.
		if len(argv) > 1 && argv[0] == "help" {
			return run(ctx, append(argv[1:], "--help"), stdout, stderr, cfg)
		}
		usage(stdout)
		return exitOK
	}
	cmd, rest := find(argv)
	if cmd == nil && isGroup(argv[0]) {
		// "idem runs" alone, or "idem runs --help": the group's commands.
		if len(argv) > 1 && isHelp(argv[1]) {
			groupUsage(stdout, argv[0])
			return exitOK
		}
		if len(argv) == 1 {
			fmt.Fprintf(stderr, "idem %s: name a command of the group\n\n", argv[0])
		} else {
			fmt.Fprintf(stderr, "idem %s: unknown command %q\n\n", argv[0], argv[1])
		}
		groupUsage(stderr, argv[0])
		return exitUsage
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "idem: unknown command %q\n\n", strings.Join(argv[:min(2, len(argv))], " "))
		usage(stderr)
		return exitUsage
	}
	c := &call{cmd: cmd, stdout: stdout, stderr: stderr, cfg: cfg}
	fs := c.flagSet()
	if err := parse(fs, rest, &c.args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.usage(stdout, fs)
			return exitOK
		}
		fmt.Fprintf(stderr, "idem %s: %v\n", cmd.name, err)
		c.usage(stderr, fs)
		return exitUsage
	}
	if len(c.args) != len(cmd.args) {
		fmt.Fprintf(stderr, "idem %s: want %d arguments (%s), got %d\n", cmd.name, len(cmd.args), strings.Join(cmd.args, " "), len(c.args))
		c.usage(stderr, fs)
		return exitUsage
	}
	err := cmd.run(ctx, c)
	if c.pool != nil {
		c.pool.Close()
	}
	var uerr *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &uerr):
		fmt.Fprintf(stderr, "idem %s: %s\n", cmd.name, escape(err.Error()))
		return exitUsage
	default:
		// An error may quote what was stored (a run's error, a workflow's name): escaped as in
		// tables, whole.
		fmt.Fprintf(stderr, "idem %s: %s\n", cmd.name, escape(strings.TrimPrefix(err.Error(), "idem: ")))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
			fmt.Fprintf(stderr, "idem %s: a table is missing: run \"idem migrate\" (with the same --schema) for idem's tables, and River's rivermigrate for River's\n", cmd.name)
		}
		return exitFailed
	}
}

// versionLine names the module and version the binary was built from, and the schema version
// its migrations bring a database to: what an operator needs to match a binary with a database.
func versionLine() string {
	path, version := "github.com/idemkit/idem", "(devel)"
	if info, ok := debug.ReadBuildInfo(); ok {
		if info.Main.Path != "" {
			path = info.Main.Path
		}
		if info.Main.Version != "" {
			version = info.Main.Version
		}
	}
	return fmt.Sprintf("idem %s %s, schema version %d", path, version, len(idem.Migrations()))
}

func isHelp(s string) bool { return s == "-h" || s == "-help" || s == "--help" }

// find picks the command named by the first one or two words of argv.
func find(argv []string) (*command, []string) {
	for _, c := range commands {
		words := strings.Fields(c.name)
		if len(argv) >= len(words) && strings.Join(argv[:len(words)], " ") == c.name {
			return c, argv[len(words):]
		}
	}
	return nil, nil
}

// flagSet makes the command's flags: the common ones, then its own. It prints nothing itself:
// run says what went wrong, and where.
func (c *call) flagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("idem "+c.cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&c.databaseURL, "database-url", "", "Postgres connection URL (default $DATABASE_URL)")
	fs.StringVar(&c.schema, "schema", "", "Postgres schema of idem's tables, as given to idem.Migrate (default: search_path decides)")
	fs.BoolVar(&c.json, "json", false, "print JSON instead of aligned tables")
	if c.cmd.flags != nil {
		c.cmd.flags(fs, c)
	}
	return fs
}

func (c *call) usage(w io.Writer, fs *flag.FlagSet) {
	line := "idem " + c.cmd.name + " [flags]"
	if len(c.cmd.args) > 0 {
		line += " " + strings.Join(c.cmd.args, " ")
	}
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", line, c.cmd.summary)
	if c.cmd.help != "" {
		fmt.Fprintf(w, "\n%s\n", c.cmd.help)
	}
	fmt.Fprintf(w, "\nFlags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// parse parses flags wherever they are among the positional arguments, which the flag package
// alone stops at.
func parse(fs *flag.FlagSet, args []string, positional *[]string) error {
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return nil
		}
		if rest[0] == "--" {
			*positional = append(*positional, rest[1:]...)
			return nil
		}
		*positional = append(*positional, rest[0])
		args = rest[1:]
	}
}

// isGroup reports whether word is the first word of commands of two words ("keys", "runs").
func isGroup(word string) bool {
	for _, c := range commands {
		if first, _, two := strings.Cut(c.name, " "); two && first == word {
			return true
		}
	}
	return false
}

// groupUsage lists the commands of a group.
func groupUsage(w io.Writer, group string) {
	fmt.Fprintf(w, "Usage: idem %s COMMAND [flags] [arguments]\n\nCommands:\n", group)
	tw := newTable(w)
	for _, c := range commands {
		if strings.HasPrefix(c.name, group+" ") {
			tw.row("  "+strings.TrimSpace(c.name+" "+strings.Join(c.args, " ")), c.summary)
		}
	}
	tw.flush()
	fmt.Fprintf(w, "\nidem %s COMMAND --help says more about one.\n", group)
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "idem operates idem's keys and workflow runs in Postgres.\n\nUsage: idem COMMAND [flags] [arguments]\n\nCommands:\n")
	names := make([]string, 0, len(commands))
	byName := map[string]*command{}
	for _, c := range commands {
		names = append(names, c.name)
		byName[c.name] = c
	}
	sort.Strings(names)
	tw := newTable(w)
	for _, n := range names {
		c := byName[n]
		tw.row("  "+strings.TrimSpace(n+" "+strings.Join(c.args, " ")), c.summary)
	}
	tw.flush()
	fmt.Fprintf(w, "\nEvery command takes --database-url (default $DATABASE_URL), --schema, --json and --help;\n"+
		"idem --version prints the module's version and the schema version it migrates to.\n"+
		"Tables escape control characters of stored strings and clip long ones; --json has them whole.\n"+
		"Exit codes: 0 success, 1 failure, 2 usage.\n")
}
