package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/badger/v4/y"
	"github.com/dgraph-io/ristretto/v2/z"
)

// badger's entry flags (value.go).
const (
	metaDelete       = 1 << 0
	metaValuePointer = 1 << 1
	metaTxn          = 1 << 6
	metaFinTxn       = 1 << 7
)

// version is one key's value as of one commit, as a table or a log holds it.
type version struct {
	ts      uint64
	deleted bool
	value   []byte
}

// salvage reads every record still readable in a possibly damaged store, without badger and
// without MANIFEST: each table whose checksums hold, each committed transaction of each of
// badger's logs and each commit of the write-ahead log, skipping bad entries instead of stopping
// at them; the newest version of each key wins. It
// returns the files it could not read in full.
func salvage(dir string) (map[string][]byte, []string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	newest := map[string]version{}
	keep := func(key []byte, v version) {
		if bytes.HasPrefix(key, []byte("!badger!")) {
			return
		}
		k := string(key)
		if old, ok := newest[k]; !ok || v.ts > old.ts {
			newest[k] = v
		}
	}
	var unreadable []string
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(dir, name)
		var err error
		switch {
		case strings.HasSuffix(name, ".sst"):
			err = salvageTable(path, keep)
		case strings.HasSuffix(name, ".mem"):
			err = salvageLog(path, keep)
		case strings.HasSuffix(name, segmentExt):
			err = salvageSegment(path, keep)
		default:
			continue
		}
		if err != nil {
			unreadable = append(unreadable, fmt.Sprintf("%s (%v)", path, err))
		}
	}
	records := map[string][]byte{}
	for k, v := range newest {
		if !v.deleted {
			records[k] = v.value
		}
	}
	sort.Strings(unreadable)
	return records, unreadable, nil
}

func salvageTable(path string, keep func([]byte, version)) (err error) {
	mf, err := z.OpenMmapFile(path, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			mf.Close(-1)
			err = fmt.Errorf("unreadable: %s", oneLine(p))
		}
	}()
	t, err := table.OpenTable(mf, table.Options{ChkMode: options.OnTableRead, Compression: options.None, ReadOnly: true})
	if err != nil {
		return err
	}
	defer t.Close(-1)
	it := t.NewIterator(0)
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		vs := it.Value()
		if vs.Meta&metaValuePointer != 0 {
			continue // in the value log, which records never reach
		}
		keep(y.ParseKey(it.Key()), version{ts: y.ParseTs(it.Key()), deleted: vs.Meta&metaDelete != 0,
			value: bytes.Clone(vs.Value)})
	}
	return nil
}

// salvageLog applies each committed transaction of a memtable log; past a bad entry it resumes at
// the next valid one.
func salvageLog(path string, keep func([]byte, version)) error {
	log, err := loadLog(path)
	if err != nil {
		return err
	}
	defer log.close()
	data := log.data
	var txn []logEntry
	skipped := false
	for off := logHeaderSize; off < len(data); {
		n, ok := entryAt(data, off)
		if !ok {
			next := log.nextCandidate(off + 1)
			if next < len(data) || !allZero(data[off:]) {
				skipped = true
			}
			off = next
			txn = txn[:0] // a transaction with a bad entry is lost whole
			continue
		}
		e := decodeEntry(data[off : off+n])
		off += n
		switch {
		case e.meta&metaFinTxn != 0:
			for _, t := range txn {
				keep(y.ParseKey(t.key), version{ts: y.ParseTs(t.key), deleted: t.meta&metaDelete != 0, value: t.value})
			}
			txn = txn[:0]
		case e.meta&metaTxn != 0:
			if e.meta&metaValuePointer == 0 {
				txn = append(txn, e)
			}
		case e.meta&metaValuePointer == 0:
			keep(y.ParseKey(e.key), version{ts: y.ParseTs(e.key), deleted: e.meta&metaDelete != 0, value: e.value})
		}
	}
	if skipped {
		return errors.New("bad entries skipped")
	}
	return nil
}

// salvageSegment keeps every valid commit record of a write-ahead log segment; past a bad one it
// resumes at the next offset where a valid record starts.
func salvageSegment(path string, keep func([]byte, version)) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	skipped := false
	for off := 0; off < len(data); {
		r, n, ok := recordAt(data, off)
		if !ok {
			if data[off] != 0 {
				skipped = true
			}
			off++
			continue
		}
		for _, w := range r.writes {
			keep([]byte(w.key), version{ts: r.ts, deleted: w.delete, value: w.value})
		}
		off += n
	}
	if skipped {
		return errors.New("bad records skipped")
	}
	return nil
}

// logEntry is one entry of a log, its key still carrying its version.
type logEntry struct {
	key   []byte
	meta  byte
	value []byte
}

// decodeEntry splits a valid entry (see entryAt) into its parts, copied.
func decodeEntry(b []byte) logEntry {
	klen, n1 := binary.Uvarint(b[2:])
	vlen, n2 := binary.Uvarint(b[2+n1:])
	_, n3 := binary.Uvarint(b[2+n1+n2:])
	key := 2 + n1 + n2 + n3
	value := key + int(klen)
	return logEntry{key: bytes.Clone(b[key:value]), meta: b[0], value: bytes.Clone(b[value : value+int(vlen)])}
}
