package kv

import (
	"bytes"
	"fmt"
	"log"
	"math"
	"os"
	"sync"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/badger/v4/y"
	"github.com/dgraph-io/ristretto/v2/z"

	"github.com/cockpitfs/cockpitfs/storage"
)

// Damage met while serving. badger verifies each table block against its checksum as it reads
// it, but its lookups and iterators drop the error: a key in a damaged block reads as missing,
// and a scan ends early without a word. So every read whose answer such a block could have cut
// short — a Get that finds nothing, every Scan — reads the same range again from the same
// tables through handles of cockpitfs's own, whose iterators tell a failed block from the
// table's end. The first damage found fails the store closed, as VerifyTables does.
//
// A Get that finds an older version because the block of a newer one failed is not caught: the
// rolling check before each backup (VerifyTables) is what finds that.

// tables are the handles, by table id, of the tables badger serves from. mu is held for a whole
// check: a refresh closes the handles of tables badger dropped, which unmaps them.
//
// The handles map table files a second time, and badger deletes a dropped table's file by
// truncating it first, when the table's last reference goes: a read through a map past a file's
// end is SIGBUS, which no recover sees. So a check reads only tables it pinned (pin) for its
// whole length, through badger's own reference counts.
type tables struct {
	mu   sync.Mutex
	dir  string
	open map[uint64]*table.Table
}

// pinAttempts bounds how often pin lists again when compactions change the tables under it.
const pinAttempts = 3

// pin holds a reference badger counts on each table it serves from, until release: a read
// iterator counts one on every table in the tree when it is made. It returns the ids of the
// tables pinned: those listed both before and after the iterator was made were in the tree
// throughout (badger never puts a dropped table back, nor moves one between levels), so the
// iterator counted them. A table a compaction wrote in between is left out when compactions
// keep racing pin past its attempts; it was verified as badger wrote it, and the next check
// reads it.
func pin(bdb *badger.DB) (ids map[uint64]bool, release func()) {
	for attempt := 1; ; attempt++ {
		before := bdb.Tables()
		btx := bdb.NewTransactionAt(math.MaxUint64, false)
		it := btx.NewIterator(badger.IteratorOptions{}) // no prefix: it counts every table
		release = func() {
			it.Close()
			btx.Discard()
		}
		after := bdb.Tables()
		listed := make(map[uint64]bool, len(before))
		for _, info := range before {
			listed[info.ID] = true
		}
		ids = make(map[uint64]bool, len(after))
		for _, info := range after {
			if listed[info.ID] {
				ids[info.ID] = true
			}
		}
		if len(ids) == len(after) || attempt == pinAttempts {
			return ids, release
		}
		release()
	}
}

// current refreshes the handles to the pinned tables and returns them; mu is held.
func (ts *tables) current(pinned map[uint64]bool) ([]*table.Table, error) {
	if ts.open == nil {
		ts.open = map[uint64]*table.Table{}
	}
	for id, t := range ts.open {
		if !pinned[id] {
			t.Close(-1) // Close, not DecrRef: the last reference's DecrRef deletes the file
			delete(ts.open, id)
		}
	}
	out := make([]*table.Table, 0, len(pinned))
	for id := range pinned {
		t, ok := ts.open[id]
		if !ok {
			var err error
			if t, err = openServedTable(table.NewFilename(id, ts.dir)); err != nil {
				return nil, err
			}
			ts.open[id] = t
		}
		out = append(out, t)
	}
	return out, nil
}

func openServedTable(path string) (t *table.Table, err error) {
	mf, err := z.OpenMmapFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer func() {
		if p := recover(); p != nil {
			mf.Close(-1)
			err = fmt.Errorf("%s is unreadable: %s", path, oneLine(p))
		}
	}()
	// Blocks are verified as they are read; the whole table was verified when the store opened
	// or when badger wrote it.
	t, err = table.OpenTable(mf, table.Options{ChkMode: options.OnBlockRead, Compression: options.None, ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("%s fails its checksum: %w", path, err)
	}
	return t, nil
}

func (ts *tables) closeAll() {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for id, t := range ts.open {
		t.Close(-1)
		delete(ts.open, id)
	}
}

// testHookChecking, when set, runs in each check between pinning the tables and reading them.
var testHookChecking func()

// checkMissing reads key again from every table that may hold it, after badger found none.
func (db *DB) checkMissing(key []byte) error {
	hash := y.Hash(key)
	return db.checkTables(key, func(t *table.Table) bool { return !t.DoesNotHave(hash) }, false)
}

// checkScan reads every key with prefix again from every table that may hold one.
func (db *DB) checkScan(prefix []byte) error {
	return db.checkTables(prefix, func(*table.Table) bool { return true }, true)
}

// checkTables reads from start in each table whose key range reaches it (and that want
// accepts): one entry, or every entry with start as prefix. A read that stops before the
// table's last key met a block that failed its checksum.
func (db *DB) checkTables(start []byte, want func(*table.Table) bool, prefix bool) (err error) {
	ts := &db.tables
	ts.mu.Lock()
	defer ts.mu.Unlock()
	var damaged string
	defer func() {
		if p := recover(); p != nil {
			err = db.failClosed(fmt.Errorf("kv: %s is damaged (a read of %q failed: %s)", damaged, start, oneLine(p)))
		} else if damaged != "" {
			err = db.failClosed(fmt.Errorf("kv: %s is damaged (a read of %q met a block that fails its checksum)", damaged, start))
		}
	}()
	pinned, release := pin(db.bdb)
	defer release()
	open, err := ts.current(pinned)
	if err != nil {
		damaged = err.Error()
		return nil
	}
	if testHookChecking != nil {
		testHookChecking()
	}
	for _, t := range open {
		damaged = t.Filename()
		if bytes.Compare(y.ParseKey(t.Biggest()), start) < 0 || !reaches(t, start, prefix) || !want(t) {
			continue
		}
		if !readsThrough(t, start, prefix) {
			return nil
		}
	}
	damaged = ""
	return nil
}

// reaches says whether t's first key is at most start (or, for a prefix, below its end).
func reaches(t *table.Table, start []byte, prefix bool) bool {
	first := y.ParseKey(t.Smallest())
	if !prefix {
		return bytes.Compare(first, start) <= 0
	}
	return bytes.Compare(first, start) <= 0 || bytes.HasPrefix(first, start)
}

// readsThrough seeks t to start and reads on while keys have start as prefix (prefix), or the one
// entry found (not prefix). It reports false when the iterator stopped before t's last key,
// which only a failed block makes it do: t's last key is at or after start.
func readsThrough(t *table.Table, start []byte, prefix bool) bool {
	it := t.NewIterator(0)
	defer it.Close()
	var last []byte
	for it.Seek(y.KeyWithTs(start, math.MaxUint64)); it.Valid(); it.Next() {
		last = it.Key()
		if !prefix || !bytes.HasPrefix(y.ParseKey(last), start) {
			return true
		}
	}
	return bytes.Equal(last, t.Biggest())
}

// failClosed records err as the store's damage: from now on every View and Update returns it.
func (db *DB) failClosed(err error) error {
	err = fmt.Errorf("%w; every operation now answers EIO: stop the daemon and run cockpitfs restore: %w", err, storage.ErrCorrupt)
	if db.damaged.CompareAndSwap(nil, &err) {
		log.Print(err)
	}
	return *db.damaged.Load()
}
