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
	"github.com/cockpitfs/cockpitfs/storage/etcdstore"
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
	if to.dir != "" && unfinishedMigration(to.dir) != nil {
		// What a killed migration copied is copied anew: the directory was empty before it.
		if err := emptyStore(to.store); err != nil {
			return fmt.Errorf("%s: empty what the unfinished migration copied: %w", positional[1], err)
		}
	}
	if n, err := countKeys(to.store); err != nil || n != 0 {
		if err == nil {
			err = fmt.Errorf("it holds %d keys; migrate only into an empty store", n)
		}
		return fmt.Errorf("%s: %w; nothing was changed", positional[1], err)
	}
	if to.dir != "" {
		if err := markMigrating(to.dir, source(positional[0])); err != nil {
			return err
		}
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
			if to.dir != "" && strings.HasSuffix(undone, "left empty") {
				os.Remove(filepath.Join(to.dir, migratingName))
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
	if to.dir != "" {
		if err := unmarkMigrating(to.dir); err != nil {
			return err
		}
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

func countKeys(s storage.Store) (int, error) {
	n := 0
	err := s.View(func(tx storage.Txn) error {
		return tx.Scan("", func(string, []byte) error { n++; return nil })
	})
	return n, err
}

type migrating struct {
	store storage.Store
	close func() error
	dir   string // a data directory's path ("" for etcd)
}

// migratingName marks a data directory a migration copies into, from before its first key to
// after the copy is verified: it names the source. mount, verify and backup refuse such a
// directory (a kill may have left part of the keys), and migrating into it again copies anew.
const migratingName = "MIGRATING"

// unfinishedMigration refuses a data directory a migration into it did not finish.
func unfinishedMigration(dir string) error {
	from, err := os.ReadFile(filepath.Join(dir, migratingName))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return err
	}
	src := strings.TrimSpace(string(from))
	return fmt.Errorf("%s holds an unfinished migration from %s (it was stopped before it ended and may hold part of the keys); nothing was changed: run `cockpitfs migrate %s %s` again, which copies everything anew", dir, src, src, dir)
}

// source is where as a later command names it: a data directory's absolute path, an etcd URL.
func source(where string) string {
	if abs, err := filepath.Abs(where); err == nil && !strings.HasPrefix(where, etcdstore.Scheme) {
		return abs
	}
	return where
}

// markMigrating writes dir's marker naming from (a temporary file, synced, renamed, dir synced).
func markMigrating(dir, from string) error {
	tmp := filepath.Join(dir, migratingName+".tmp")
	err := writeSynced(tmp, []byte(from+"\n"))
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, migratingName))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("mark %s as being migrated into: %w; nothing was copied", dir, err)
	}
	return nil
}

// unmarkMigrating removes dir's marker once the copy is whole and verified.
func unmarkMigrating(dir string) error {
	if err := os.Remove(filepath.Join(dir, migratingName)); err != nil {
		return fmt.Errorf("the copy is whole, but its marker stays: %w", err)
	}
	return syncDir(dir)
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

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
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
	if strings.HasPrefix(where, etcdstore.Scheme) {
		*sf.store = where
		cfg, _, err := sf.etcd()
		*sf.store = ""
		if err != nil {
			return migrating{}, err
		}
		s, err := openEtcd(cfg)
		if err != nil {
			return migrating{}, err
		}
		return migrating{s, s.Close, ""}, nil
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
