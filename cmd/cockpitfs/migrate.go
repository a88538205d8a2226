package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
	"github.com/cockpitfs/cockpitfs/storage/etcdconf"
)

// migrateBatch is how many keys one destination transaction writes: under etcd's default
// --max-txn-ops (128).
const migrateBatch = 100

// migrateCommand copies every key of one store into another, empty one: a badger data directory
// into an etcd prefix, or back. The source is read in one snapshot; the copy is verified.
func migrateCommand(args []string) error {
	fset := newFlags("migrate")
	sf := addStoreFlags(fset)
	positional, err := parseInterspersed(fset, args)
	if err != nil {
		return err
	}
	if len(positional) != 2 || *sf.store != "" {
		return &usageError{command: "migrate", msg: "migrate takes FROM and TO, each a data directory or etcd://HOST:PORT/PREFIX"}
	}
	from, err := openMigrating(positional[0], sf, true)
	if err != nil {
		return fmt.Errorf("from %s: %w", positional[0], err)
	}
	defer from.close()
	to, err := openMigrating(positional[1], sf, false)
	if err != nil {
		return fmt.Errorf("to %s: %w", positional[1], err)
	}
	defer to.close()

	var keys []string
	values := map[string][]byte{}
	err = from.store.View(func(tx storage.Txn) error {
		return tx.Scan("", func(k string, v []byte) error {
			if strings.HasPrefix(k, "m/") {
				return nil // a daemon's announcement lives only as long as its etcd lease
			}
			keys = append(keys, k)
			values[k] = v
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("read %s: %w", positional[0], err)
	}
	var unfinished *unfinishedMigrationError
	if err := to.unfinished(positional[1]); errors.As(err, &unfinished) {
		// What a killed migration copied is copied anew: the store was empty before it.
		if err := emptyStore(to.store); err != nil {
			return fmt.Errorf("%s: empty what the unfinished migration copied: %w", positional[1], err)
		}
	} else if err != nil {
		return fmt.Errorf("%s: %w; nothing was changed", positional[1], err)
	}
	if n, err := countKeys(to.store); err != nil || n != 0 {
		if err == nil {
			err = fmt.Errorf("it holds %d keys; migrate only into an empty store", n)
		}
		return fmt.Errorf("%s: %w; nothing was changed", positional[1], err)
	}
	if err := to.mark(source(positional[0])); err != nil {
		return fmt.Errorf("mark %s as being migrated into: %w; nothing was copied", positional[1], err)
	}
	for i := 0; i < len(keys); i += migrateBatch {
		batch := keys[i:min(i+migrateBatch, len(keys))]
		err := to.store.Update(context.Background(), func(tx storage.Txn) error {
			for _, k := range batch {
				if err := tx.Set(k, values[k]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			undone := undoMigration(to.store, keys[:i])
			if strings.HasSuffix(undone, "left empty") {
				to.unmark()
			}
			return fmt.Errorf("write %s: %w; %s", positional[1], err, undone)
		}
	}
	violations, checked, err := engine.Verify(to.store)
	if err != nil {
		return fmt.Errorf("verify %s: %w", positional[1], err)
	}
	if n, err := countKeys(to.store); err != nil || n != len(keys) {
		return fmt.Errorf("%s holds %d keys after copying %d (%v)", positional[1], n, len(keys), err)
	}
	if err := to.unmark(); err != nil {
		return fmt.Errorf("the copy in %s is whole, but its mark stays: %w", positional[1], err)
	}
	for _, v := range violations {
		fmt.Println(v)
	}
	fmt.Printf("copied %d keys (%d records) from %s to %s\n", len(keys), checked, positional[0], positional[1])
	if len(violations) > 0 {
		return fmt.Errorf("%d violations in the copy, as in the source", len(violations))
	}
	return nil
}

// undoMigration removes the keys an interrupted migration wrote, so the destination is empty again.
func undoMigration(s storage.Store, written []string) string {
	for i := 0; i < len(written); i += migrateBatch {
		batch := written[i:min(i+migrateBatch, len(written))]
		err := s.Update(context.Background(), func(tx storage.Txn) error {
			for _, k := range batch {
				if err := tx.Delete(k); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Sprintf("removing the %d keys already copied failed too (%v): empty the destination before trying again", len(written), err)
		}
	}
	return "the destination was left empty"
}

// countKeys counts s's keys but a migration's mark.
func countKeys(s storage.Store) (int, error) {
	n := 0
	err := s.View(func(tx storage.Txn) error {
		return tx.Scan("", func(k string, _ []byte) error {
			if k != migratingKey {
				n++
			}
			return nil
		})
	})
	return n, err
}

type migrating struct {
	store storage.Store
	close func() error
	dir   string // a data directory's path ("" for etcd)
}

// migratingName marks a data directory a migration copies into, and migratingKey an etcd prefix,
// from before its first key to after the copy is verified: it names the source. mount, verify
// and backup refuse such a store (a kill may have left part of the keys), and migrating into it
// again copies anew. (No record's key is without a slash: see engine/keys.go.)
const (
	migratingName = "MIGRATING"
	migratingKey  = "migrating"
)

// unfinishedMigrationError is a store a migration into did not finish.
type unfinishedMigrationError struct{ to, from string }

func (e *unfinishedMigrationError) Error() string {
	return fmt.Sprintf("%s holds an unfinished migration from %s (it was stopped before it ended and may hold part of the keys); nothing was changed: run `cockpitfs migrate %s %s` again, which copies everything anew", e.to, e.from, e.from, e.to)
}

// unfinishedMigration refuses a data directory a migration into it did not finish.
func unfinishedMigration(dir string) error {
	from, err := os.ReadFile(filepath.Join(dir, migratingName))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return err
	}
	return &unfinishedMigrationError{to: dir, from: strings.TrimSpace(string(from))}
}

// unfinishedMigrationIn refuses an etcd prefix, where, a migration into it did not finish.
func unfinishedMigrationIn(s storage.Store, where string) error {
	var from []byte
	err := s.View(func(tx storage.Txn) error {
		v, err := tx.Get(migratingKey)
		if errors.Is(err, storage.ErrNotFound) {
			return nil
		}
		from = v
		return err
	})
	if err != nil || from == nil {
		return err
	}
	return &unfinishedMigrationError{to: where, from: string(from)}
}

// source is where as a later command names it: a data directory's absolute path, an etcd URL.
func source(where string) string {
	if abs, err := filepath.Abs(where); err == nil && !strings.HasPrefix(where, etcdconf.Scheme) {
		return abs
	}
	return where
}

// unfinished refuses m when a migration into it did not finish.
func (m migrating) unfinished(where string) error {
	if m.dir != "" {
		return unfinishedMigration(m.dir)
	}
	return unfinishedMigrationIn(m.store, where)
}

// mark marks m as being migrated into from from: a file written whole and synced, or a key.
func (m migrating) mark(from string) error {
	if m.dir == "" {
		return m.store.Update(context.Background(), func(tx storage.Txn) error { return tx.Set(migratingKey, []byte(from)) })
	}
	tmp := filepath.Join(m.dir, migratingName+".tmp")
	err := writeSynced(tmp, []byte(from+"\n"))
	if err == nil {
		err = os.Rename(tmp, filepath.Join(m.dir, migratingName))
	}
	if err == nil {
		err = kv.SyncDir(m.dir)
	}
	return err
}

// unmark removes m's mark once the copy is whole and verified.
func (m migrating) unmark() error {
	if m.dir == "" {
		return m.store.Update(context.Background(), func(tx storage.Txn) error { return tx.Delete(migratingKey) })
	}
	if err := os.Remove(filepath.Join(m.dir, migratingName)); err != nil {
		return err
	}
	return kv.SyncDir(m.dir)
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	return err
}

// emptyStore deletes every key of s.
func emptyStore(s storage.Store) error {
	var keys []string
	err := s.View(func(tx storage.Txn) error {
		return tx.Scan("", func(k string, _ []byte) error { keys = append(keys, k); return nil })
	})
	if err != nil {
		return err
	}
	if undone := undoMigration(s, keys); !strings.HasSuffix(undone, "left empty") {
		return errors.New(undone)
	}
	return nil
}

// openMigrating opens a data directory (exclusively: no daemon may serve it meanwhile) or an etcd
// prefix (whose daemons must be stopped by hand: etcd has no such lock).
func openMigrating(where string, sf *storeFlags, source bool) (migrating, error) {
	if strings.HasPrefix(where, etcdconf.Scheme) {
		*sf.store = where
		cfg, _, err := sf.etcd()
		*sf.store = ""
		if err != nil {
			return migrating{}, err
		}
		return team.open(cfg, where, source)
	}
	if source {
		db, err := openOffline(where)
		if err != nil {
			return migrating{}, err
		}
		return migrating{db, db.Close, ""}, nil
	}
	db, err := kv.Open(where)
	if err != nil {
		return migrating{}, heldHint(damageHint(err, where))
	}
	return migrating{db, db.Close, where}, nil
}
