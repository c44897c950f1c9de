package idemcli

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redact"
)

// connect opens a pool on the database the flags name.
// connect returns the call's pool, made on first use; run closes it when the command is done.
func (c *call) connect(ctx context.Context) (*pgxpool.Pool, error) {
	if c.pool != nil {
		return c.pool, nil
	}
	if c.databaseURL == "" {
		c.databaseURL = os.Getenv("DATABASE_URL")
	}
	if c.databaseURL == "" {
		return nil, usagef("no database: set DATABASE_URL or pass --database-url")
	}
	cfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return nil, usagef("--database-url: %v", err)
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("error connecting: %w", err)
	}
	c.pool = pool
	return pool, nil
}

func (c *call) opts() []idem.Option { return []idem.Option{idem.Schema(c.schema)} }

func (c *call) key(scope, id string) (idem.Key, error) {
	k := idem.Key{Scope: scope, ID: id}
	if err := k.Validate(); err != nil {
		return k, usagef("%v", err)
	}
	return k, nil
}

var migrateCmd = &command{
	name:    "migrate",
	summary: "Bring idem's tables up to date (or to --to N).",
	help: "Without --to it applies what is pending, and does nothing when the schema is current.\n" +
		"--to N moves up or down to version N; --to 0 drops idem's tables and their data.",
	flags: func(fs *flag.FlagSet, c *call) {
		fs.Func("to", "version to move to, up or down (default: the latest)", func(v string) error {
			n, err := strconv.Atoi(v)
			if err != nil {
				return errors.New("not a number")
			}
			c.to = &n
			return nil
		})
	},
	run: func(ctx context.Context, c *call) error {
		// Unset is the latest; a negative --to is a mistake, not a way to say "the latest".
		if latest := len(idem.Migrations()); c.to != nil && (*c.to < 0 || *c.to > latest) {
			return usagef("--to must be a version from 0 to %d, the latest (got %d)", latest, *c.to)
		}
		pool, err := c.connect(ctx)
		if err != nil {
			return err
		}
		from, err := idem.SchemaVersion(ctx, pool, c.opts()...)
		if err != nil {
			return err
		}
		if c.to != nil {
			err = idem.MigrateTo(ctx, pool, *c.to, c.opts()...)
		} else {
			err = idem.Migrate(ctx, pool, c.opts()...)
		}
		if err != nil {
			return err
		}
		to, err := idem.SchemaVersion(ctx, pool, c.opts()...)
		if err != nil {
			return err
		}
		msg := fmt.Sprintf("schema at version %d (was %d)", to, from)
		if to == from {
			msg = fmt.Sprintf("schema at version %d, nothing to do", to)
		}
		return c.done(msg, map[string]int{"from": from, "version": to})
	},
}

var keysGetCmd = &command{
	name:    "keys get",
	args:    []string{"SCOPE", "ID"},
	summary: "Show what is stored under a key: fingerprint, times, result size, its run.",
	run: func(ctx context.Context, c *call) error {
		key, err := c.key(c.args[0], c.args[1])
		if err != nil {
			return err
		}
		pool, err := c.connect(ctx)
		if err != nil {
			return err
		}
		info, err := idem.KeyGet(ctx, pool, key, c.opts()...)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(newKeyJSON(info))
		}
		t := newTable(c.stdout)
		t.row("scope", info.Scope)
		t.row("id", info.ID)
		t.row("hash", redact.Hash(info.Scope, info.ID))
		t.row("fingerprint", orDash(hex.EncodeToString(info.Fingerprint)))
		t.row("created", stamp(info.Created))
		if info.Workflow != "" {
			t.row("expires", "with its run")
			t.row("run", info.Workflow+" ("+orDash(info.RunState)+")")
			t.row("", "idem runs show "+strconv.Quote(info.Scope)+" "+strconv.Quote(info.ID))
		} else {
			exp := stampPtr(info.Expires)
			if info.Expired {
				exp += " (expired)"
			}
			t.row("expires", exp)
			t.row("result", strconv.Itoa(info.ResultSize)+" bytes")
		}
		t.flush()
		return nil
	},
}

// keyJSON is a key as --json prints it: KeyInfo with its fingerprint in hex, as tables show it
// (encoding/json would write the bytes in base64), and the hash that stands for the key in
// idem's spans and logs.
type keyJSON struct {
	*idem.KeyInfo
	Fingerprint string `json:"fingerprint,omitempty"`
	Hash        string `json:"key_hash"`
}

func newKeyJSON(k *idem.KeyInfo) keyJSON {
	return keyJSON{k, hex.EncodeToString(k.Fingerprint), redact.Hash(k.Scope, k.ID)}
}

type keyListFlags struct {
	scope, prefix, after string
	limit                int
}

var keysListCmd = &command{
	name:    "keys list",
	summary: "List the keys stored in a scope, by id: what a client sent.",
	help: "Keys of idem.Do (expired ones too, until they are reaped) and of workflow runs, in the\n" +
		"byte order of their ids. When more keys match than --limit, the last line gives the\n" +
		"--after cursor of the next page.",
	flags: func(fs *flag.FlagSet, c *call) {
		fs.StringVar(&c.keyList.scope, "scope", "", "the scope to list (required)")
		fs.StringVar(&c.keyList.prefix, "prefix", "", "only keys whose id starts with this")
		fs.IntVar(&c.keyList.limit, "limit", idem.DefaultKeyListLimit, fmt.Sprintf("page size, at most %d", idem.MaxKeyListLimit))
		fs.StringVar(&c.keyList.after, "after", "", "cursor of the page before, from the previous listing")
	},
	run: func(ctx context.Context, c *call) error {
		f := c.keyList
		if f.scope == "" {
			return usagef("--scope is required: keys are listed one scope at a time")
		}
		if f.limit < 1 || f.limit > idem.MaxKeyListLimit {
			return usagef("--limit must be between 1 and %d (got %d)", idem.MaxKeyListLimit, f.limit)
		}
		if _, err := c.key(f.scope, "-"); err != nil { // the scope, as KeyList checks it
			return err
		}
		if f.prefix != "" {
			if err := idem.ValidateID(f.prefix); err != nil {
				return usagef("--prefix %q cannot start a key's id: %v", f.prefix, err)
			}
		}
		pool, err := c.connect(ctx)
		if err != nil {
			return err
		}
		res, err := idem.KeyList(ctx, pool, &idem.KeyListParams{Scope: f.scope, Prefix: f.prefix, After: f.after, Limit: f.limit}, c.opts()...)
		switch {
		case errors.Is(err, idem.ErrInvalidCursor):
			return usagef("--after %q is not a cursor that keys list printed for scope %q (its last line, \"more: --after ...\")", f.after, f.scope)
		case err != nil:
			return err
		}
		if c.json {
			keys := make([]keyJSON, len(res.Keys))
			for i, k := range res.Keys {
				keys[i] = newKeyJSON(k)
			}
			return c.printJSON(struct {
				Keys []keyJSON `json:"keys"`
				Next string    `json:"next,omitempty"`
			}{keys, res.Next})
		}
		t := newTable(c.stdout)
		t.row("ID", "CREATED", "EXPIRES", "RESULT", "FINGERPRINT")
		for _, k := range res.Keys {
			if k.Workflow != "" {
				t.row(k.ID, stamp(k.Created), "with its run", "-", "-", "run of "+k.Workflow+" ("+orDash(k.RunState)+")")
				continue
			}
			exp := stampPtr(k.Expires)
			if k.Expired {
				exp += " (expired)"
			}
			t.row(k.ID, stamp(k.Created), exp, strconv.Itoa(k.ResultSize)+" bytes", orDash(hex.EncodeToString(k.Fingerprint)))
		}
		t.flush()
		if res.Next != "" {
			fmt.Fprintf(c.stdout, "more: --after %s\n", res.Next)
		}
		return nil
	},
}

var keysDeleteCmd = &command{
	name:    "keys delete",
	args:    []string{"SCOPE", "ID"},
	summary: "Forget a stored result of idem.Do, so that the key runs again.",
	help: "Refused while a Do works on the key (try again in a moment), and for a run's key\n" +
		"(use idem runs cancel).",
	run: func(ctx context.Context, c *call) error {
		key, err := c.key(c.args[0], c.args[1])
		if err != nil {
			return err
		}
		pool, err := c.connect(ctx)
		if err != nil {
			return err
		}
		if err := idem.KeyDelete(ctx, pool, key, c.opts()...); err != nil {
			return err
		}
		return c.done(fmt.Sprintf("deleted key %q in scope %q", key.ID, key.Scope), map[string]any{"deleted": true, "scope": key.Scope, "id": key.ID})
	},
}

var reapCmd = &command{
	name:    "reap",
	summary: "Delete expired keys and finished runs past their TTL, now.",
	help: "What the engine's periodic reap job does; safe beside it. It also makes the payload tables'\n" +
		"partitions for the days ahead and drops those nothing live points into, and says which.",
	run: func(ctx context.Context, c *call) error {
		pool, err := c.connect(ctx)
		if err != nil {
			return err
		}
		rep, err := idem.ReapWithReport(ctx, pool, c.opts()...)
		if err != nil {
			return err
		}
		skipped := make([]string, len(rep.PartitionsSkipped))
		for i, e := range rep.PartitionsSkipped {
			skipped[i] = e.Error()
		}
		var msg strings.Builder
		fmt.Fprintf(&msg, "reaped %d expired keys (%d of Do's, %d runs, %d outbox messages)", rep.Total(), rep.Keys, rep.Runs, rep.Outbox)
		for _, p := range []struct {
			what  string
			names []string
		}{{"made", rep.PartitionsCreated}, {"dropped", rep.PartitionsDropped}} {
			if len(p.names) > 0 {
				fmt.Fprintf(&msg, "\npayload partitions %s: %s", p.what, strings.Join(p.names, ", "))
			}
		}
		for _, why := range skipped {
			fmt.Fprintf(&msg, "\npayload partitions left for a later reap: %s", why)
		}
		return c.done(msg.String(), map[string]any{"reaped": rep.Total(), "keys": rep.Keys, "runs": rep.Runs, "outbox": rep.Outbox,
			"partitions_created": nonNil(rep.PartitionsCreated), "partitions_dropped": nonNil(rep.PartitionsDropped),
			"partitions_skipped": skipped})
	},
}

// nonNil makes an empty list print as [] in JSON rather than null.
func nonNil(xs []string) []string {
	if xs == nil {
		return []string{}
	}
	return xs
}
