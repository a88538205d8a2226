package engine

import (
	"encoding/json"

	"github.com/cockpitfs/cockpitfs/storage"
)

// A stack's record is stored in pieces, so that a commit costs what it changes, not what the
// stack holds: the head (the record without its holders) under the stack's key, and each holder
// under a key of its own. Every commit on a stack writes its head (the revision moves), so a
// transaction that Gets the head conflicts with any change of the stack's holders, and head bytes
// seen before name the same holders: the cache may serve them without reading the holders' keys.
//
// A record written before holders had keys keeps them in its head ("inline"); it reads the same,
// and each commit on it moves up to migrateBatch of them to their own keys (a store may limit a
// transaction's writes: etcd's --max-txn-ops defaults to 128).
const migrateBatch = 64

// storedHolders is where a record's holders lie in the store.
type storedHolders struct {
	inline []Holder // still in the head, sorted
	bytes  int      // the JSON of every holder, summed: the record's size without encoding it
}

// saveRecord writes next, which follows prev (zero for a new stack), after checking every
// invariant: a transition that would break one is a bug and commits nothing. It writes next's
// head and the holders that differ from prev's, and returns what it wrote.
func saveRecord(tx storage.Txn, prev cachedRecord, next Record) (cachedRecord, error) {
	var err error
	if prev.checked {
		err = check(next, prev.Value) // prev passed when it was saved
	} else {
		err = checkRecord(next)
	}
	if err != nil {
		return cachedRecord{}, refuse(StateRecordMalformed, next.SubjectID, "report this as a cockpitfs bug", "transition would break the record's invariants: %v", err)
	}
	stored, err := saveHolders(tx, prev, next)
	if err != nil {
		return cachedRecord{}, err
	}
	head := next
	head.Value.Holders = stored.inline
	data, err := appendRecordJSON(make([]byte, 0, 1024), head)
	if err != nil {
		return cachedRecord{}, err
	}
	// The record as read: the head with every holder in place of null or the inline ones.
	size := len(data) - len(`null`) + len(`[]`) + stored.bytes + max(len(next.Value.Holders)-1, 0)
	if len(stored.inline) > 0 {
		inline, _ := json.Marshal(stored.inline)
		size = len(data) - len(inline) + len(`[]`) + stored.bytes + max(len(next.Value.Holders)-1, 0)
	}
	if size > maxRecordBytes {
		return cachedRecord{}, refuse(StateRecordTooLarge, next.SubjectID, "release holders, or claim with shorter checkout paths",
			"the stack's record would be %d bytes, more than %d", size, maxRecordBytes)
	}
	return cachedRecord{Record: next, raw: data, stored: stored, checked: true}, tx.Set(stackKey(next.Cockpit, next.Stack), data)
}

// saveHolders writes the holders of next that prev does not hold as they are, and deletes those
// next no longer holds. Both lists are sorted by id (next's was checked).
func saveHolders(tx storage.Txn, prev cachedRecord, next Record) (storedHolders, error) {
	stored := storedHolders{bytes: prev.stored.bytes}
	inline := map[string]bool{}
	for _, h := range prev.stored.inline {
		inline[h.HolderID] = true
	}
	moves := migrateBatch
	write := func(h Holder) error {
		data := appendHolderJSON(make([]byte, 0, 256), h)
		stored.bytes += len(data)
		return tx.Set(holderKey(next.Cockpit, next.Stack, h.HolderID), data)
	}
	before, after := prev.Value.Holders, next.Value.Holders
	for len(before) > 0 || len(after) > 0 {
		var err error
		switch {
		case len(after) == 0 || len(before) > 0 && before[0].HolderID < after[0].HolderID:
			gone := before[0]
			stored.bytes -= encodedLen(gone)
			if !inline[gone.HolderID] {
				err = tx.Delete(holderKey(next.Cockpit, next.Stack, gone.HolderID))
			}
			before = before[1:]
		case len(before) == 0 || after[0].HolderID < before[0].HolderID:
			err = write(after[0])
			after = after[1:]
		default:
			was, is := before[0], after[0]
			switch {
			case was != is:
				stored.bytes -= encodedLen(was)
				err = write(is)
			case !inline[is.HolderID]:
			case moves > 0:
				moves--
				stored.bytes -= encodedLen(was)
				err = write(is)
			default:
				stored.inline = append(stored.inline, is)
			}
			before, after = before[1:], after[1:]
		}
		if err != nil {
			return storedHolders{}, err
		}
	}
	return stored, nil
}
