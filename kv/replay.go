package kv

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/dgraph-io/badger/v4"
)

// openLog brings badger to the log's end and starts the log: every record after the last
// checkpoint replayed at its own version (sets and deletes are absolute, so replaying what badger
// already holds changes nothing), the log cut at its first torn record, and any key badger holds
// in a version beyond the log's end written back to its version at the end (after a power cut:
// badger applies a commit while its record's sync runs, and its unsynced files may keep a commit
// whose record was lost, one never acknowledged). Then a checkpoint: badger's files synced, a
// fresh segment started with a checkpoint record, and the older segments removed.
func openLog(dir string, bdb *badger.DB) (*commitLog, error) {
	scan, err := scanLog(dir)
	if err != nil {
		return nil, err
	}
	if err := truncateLog(dir, scan); err != nil {
		return nil, err
	}
	end := scan.end
	if len(scan.records) == 0 {
		// No log yet (a new store, or one a version without it wrote and synced commit by
		// commit), or one that never got its first checkpoint durable, before which nothing
		// was acknowledged: badger's files are the truth.
		end = bdb.MaxVersion()
	}
	for _, r := range scan.records {
		if r.kind == kindCommit && r.ts > scan.checkpoint {
			if err := replay(bdb, r); err != nil {
				return nil, err
			}
		}
	}
	last, err := undoBeyond(bdb, end)
	if err != nil {
		return nil, err
	}
	l := newCommitLog(dir, bdb)
	go l.applier()
	if err := l.logs.sync(); err != nil {
		return nil, fmt.Errorf("kv: sync badger's logs: %w", err)
	}
	seg, err := firstSegment(dir, scan)
	if err != nil {
		return nil, err
	}
	l.seg = seg
	l.next = last + 1
	l.sequenced.Store(last)
	l.durable.Store(last)
	l.applied.upTo.Store(last)
	ts, err := l.logCheckpoint(last)
	if err == nil {
		err = l.waitDurable(ts)
	}
	if err != nil {
		l.close()
		return nil, err
	}
	l.lastCheckpoint.Store(ts)
	for _, index := range scan.segments {
		if index != seg.index {
			if err := os.Remove(filepath.Join(dir, segmentName(index))); err != nil && !errors.Is(err, os.ErrNotExist) {
				l.close()
				return nil, fmt.Errorf("kv: %w", err)
			}
		}
	}
	bdb.SetDiscardTs(last)
	l.prepareSpare(seg.index + 1)
	l.settleDone = make(chan struct{})
	go l.settler()
	return l, nil
}

// firstSegment is the segment an opened log writes to: the last one if it is a spare never
// written (all zeros, full size), or a new one after it.
func firstSegment(dir string, scan *logScan) (*segment, error) {
	if n := len(scan.segments); n > 0 {
		index := scan.segments[n-1]
		path := filepath.Join(dir, segmentName(index))
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("kv: %w", err)
		}
		if len(data) == segmentSize && allZero(data) {
			return openSegment(path, index)
		}
		return createSegment(dir, index+1)
	}
	return createSegment(dir, 1)
}

// replay applies a commit record to badger at its version.
func replay(bdb *badger.DB, r *record) error {
	btx := bdb.NewTransactionAt(r.ts, true)
	defer btx.Discard()
	for _, w := range r.writes {
		var err error
		if w.delete {
			err = btx.Delete([]byte(w.key))
		} else {
			err = btx.Set([]byte(w.key), w.value)
		}
		if err != nil {
			return fmt.Errorf("kv: replay commit %d: %w", r.ts, err)
		}
	}
	if err := btx.CommitAt(r.ts, nil); err != nil {
		return fmt.Errorf("kv: replay commit %d: %w", r.ts, err)
	}
	return nil
}

// undoBeyond writes back, at a version above every one badger holds, each key's version at end
// where badger holds a newer one, and returns the last version used.
func undoBeyond(bdb *badger.DB, end uint64) (uint64, error) {
	highest := bdb.MaxVersion()
	if highest <= end {
		return end, nil
	}
	undo := highest + 1
	newest := bdb.NewTransactionAt(math.MaxUint64, false)
	defer newest.Discard()
	atEnd := bdb.NewTransactionAt(end, false)
	defer atEnd.Discard()
	opts := badger.DefaultIteratorOptions
	opts.AllVersions = true
	it := newest.NewIterator(opts)
	defer it.Close()
	w := bdb.NewTransactionAt(undo, true)
	defer func() { w.Discard() }()
	// do runs op in w, in a new transaction at the same version when w is full.
	do := func(op func(*badger.Txn) error) error {
		err := op(w)
		if errors.Is(err, badger.ErrTxnTooBig) {
			if err = w.CommitAt(undo, nil); err != nil {
				return err
			}
			w = bdb.NewTransactionAt(undo, true)
			err = op(w)
		}
		return err
	}
	var last []byte
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		key := item.KeyCopy(nil)
		newer := string(key) != string(last) && item.Version() > end
		last = key
		if !newer {
			continue // an older version, or a key the log's end already has
		}
		old, err := atEnd.Get(key)
		switch {
		case errors.Is(err, badger.ErrKeyNotFound):
			err = do(func(w *badger.Txn) error { return w.Delete(key) })
		case err == nil:
			var value []byte
			if value, err = old.ValueCopy(nil); err == nil {
				err = do(func(w *badger.Txn) error { return w.Set(key, value) })
			}
		}
		if err != nil {
			return 0, fmt.Errorf("kv: undo %q: %w", key, err)
		}
	}
	if err := w.CommitAt(undo, nil); err != nil {
		return 0, fmt.Errorf("kv: undo: %w", err)
	}
	return undo, nil
}
