package fs

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"runtime/debug"
	"sync"
	"time"

	"github.com/cockpitfs/cockpitfs/engine"
)

// Open snapshots are the daemon's memory that its callers choose: every open keeps the content
// it saw until it is closed, and what it writes (a document, a command's pieces) until it is
// applied or the open closes; every open directory the names it lists. Opens of the same content of a file (one revision) share one
// buffer, counted once however many opens hold it; what the opens of one uid hold, snapshots and
// written bytes together, is bounded, so one user's opens cannot exhaust the daemon that serves
// everybody; and once opens let go of much, the memory is handed back to the system rather than
// kept for the next burst.

// DefaultMaxOpenBytesPerUID is the most snapshot bytes the opens of one uid may hold: many times
// what a machine's largest file (status.json of a thousand stacks, under 1 MiB) takes, so only
// opens of many distinct contents reach it.
const DefaultMaxOpenBytesPerUID = 64 << 20

// openCost is what the daemon holds for one open beyond its content (its handle and go-fuse's
// entry for it: ≈ 340 bytes measured), counted with the uid's open bytes so that opens of empty
// files are bounded too: uncounted, one user's 20,000 opens of a wait file held 6.8 MiB, and a
// user's processes may each open as many as their hard RLIMIT_NOFILE.
const openCost = 512

// freeAfter is how many bytes the released snapshots must reach before the heap is returned to
// the system at once, and freeEvery how often at most: the runtime's own scavenger returns it
// only gradually, and a burst of opens would otherwise stay in the daemon's RSS.
const (
	freeAfter = 32 << 20
	freeEvery = 5 * time.Second
)

// snapshotSeed is the seed of every snapshot's sum in this process.
var snapshotSeed = maphash.MakeSeed()

// snapshots are the shared buffers of open snapshots and what each uid's opens hold.
type snapshots struct {
	limit int64 // per uid; 0: no bound
	// mu guards the fields below; it is a leaf (held for map accesses only).
	mu       sync.Mutex
	byKey    map[snapshotKey][]*snapshot
	uids     map[uint32]*uidSnapshots
	released int64     // bytes no open holds any more since the heap was last returned
	freedAt  time.Time // when the heap was last returned
}

type snapshotKey struct {
	path string
	sum  uint64
}

// snapshot is one shared buffer: opens holds how many opens refer to it.
type snapshot struct {
	key   snapshotKey
	data  []byte
	opens int
}

// uidSnapshots are the snapshots one uid's opens hold, each with how many of its opens do, and
// their bytes, each snapshot counted once, with the bytes its opens wrote (see charge).
type uidSnapshots struct {
	held  map[*snapshot]int
	bytes int64
}

// pin is an open's hold on a snapshot, released at the open's release.
type pin struct {
	uid uint32
	s   *snapshot
}

// acquire returns the shared buffer of data, path's content an open of uid took, and the pin the
// open releases at its end; a refusal (OPEN_SNAPSHOT_LIMIT) when it would make uid's opens hold
// more than the limit.
func (ss *snapshots) acquire(uid uint32, path string, data []byte) ([]byte, *pin, error) {
	// Equal contents are compared too: a sum may collide. maphash, since a status of a thousand
	// stacks (150 KB) is summed at every open: 12 µs, where fnv took 88.
	key := snapshotKey{path, maphash.Bytes(snapshotSeed, data)}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var s *snapshot
	for _, c := range ss.byKey[key] {
		if bytes.Equal(c.data, data) {
			s = c
			break
		}
	}
	u := ss.of(uid)
	need := int64(openCost)
	if s == nil || u.held[s] == 0 {
		need += int64(len(data))
	}
	if err := ss.within(uid, u, need, "open"); err != nil {
		return nil, nil, err
	}
	if s == nil {
		s = &snapshot{key: key, data: data}
		ss.byKey[key] = append(ss.byKey[key], s)
	}
	u.bytes += need
	u.held[s]++
	ss.uids[uid] = u
	s.opens++
	return s.data, &pin{uid: uid, s: s}, nil
}

// release ends p's hold. A snapshot no open holds is dropped; when enough bytes were dropped,
// the heap is returned to the system (at most every freeEvery).
func (ss *snapshots) release(p *pin) {
	if p == nil {
		return
	}
	ss.mu.Lock()
	u, s := ss.uids[p.uid], p.s
	u.bytes -= openCost
	if u.held[s]--; u.held[s] == 0 {
		delete(u.held, s)
		u.bytes -= int64(len(s.data))
	}
	ss.forgetIdle(p.uid, u)
	free := false
	if s.opens--; s.opens == 0 {
		kept := ss.byKey[s.key][:0]
		for _, c := range ss.byKey[s.key] {
			if c != s {
				kept = append(kept, c)
			}
		}
		if len(kept) == 0 {
			delete(ss.byKey, s.key)
		} else {
			ss.byKey[s.key] = kept
		}
		free = ss.dropped(int64(len(s.data)))
	}
	ss.mu.Unlock()
	if free {
		go debug.FreeOSMemory()
	}
}

// dropped counts n bytes no open holds any more, and says whether the heap is to be returned to
// the system now. mu is held.
func (ss *snapshots) dropped(n int64) bool {
	ss.released += n
	if now := time.Now(); ss.released >= freeAfter && now.Sub(ss.freedAt) >= freeEvery {
		ss.released, ss.freedAt = 0, now
		return true
	}
	return false
}

// within refuses (OPEN_SNAPSHOT_LIMIT) n more bytes for uid's opens, which hold u, past the limit;
// op is what would take them ("open", "write", "append", "listing"). mu is held.
func (ss *snapshots) within(uid uint32, u *uidSnapshots, n int64, op string) error {
	if ss.limit == 0 || u.bytes+n <= ss.limit {
		return nil
	}
	return &engine.Refusal{Code: engine.OpenSnapshotLimit,
		Message: fmt.Sprintf("uid %d's open files already hold %d bytes (the contents they saw, what they wrote and the directories they list); this %s would take %d more, past the %d one user's opens may hold", uid, u.bytes, op, n, ss.limit),
		Fix:     "close files and directories you no longer read or write (an open file keeps the content it saw, and what it wrote until it is applied; an open directory its list of names), or ask the daemon's administrator to raise --max-open-bytes-per-uid"}
}

// of is what uid's opens hold, a new entry (kept once something is held) when nothing. mu is held;
// the maps are made here, so the zero snapshots is ready to use.
func (ss *snapshots) of(uid uint32) *uidSnapshots {
	if ss.uids == nil {
		ss.byKey, ss.uids = map[snapshotKey][]*snapshot{}, map[uint32]*uidSnapshots{}
	}
	if u := ss.uids[uid]; u != nil {
		return u
	}
	return &uidSnapshots{held: map[*snapshot]int{}}
}

// forgetIdle drops uid's entry once its opens hold nothing. mu is held.
func (ss *snapshots) forgetIdle(uid uint32, u *uidSnapshots) {
	if len(u.held) == 0 && u.bytes == 0 {
		delete(ss.uids, uid)
	}
}

// charges are what one open holds beyond a shared snapshot, counted against the uid that opened
// it: what it wrote, or the entries a directory open lists.
type charges struct {
	uid     uint32
	charged int64
}

// charge counts what c's open holds now, total bytes, against c's uid, or refuses (OPEN_SNAPSHOT_LIMIT)
// what would pass that uid's bound; op is what grows it (a "write", an "append" open's copy of the
// document, a "listing"). An open's buffers keep their size until it closes, so the most it ever
// held stays counted until then (discharge).
func (ss *snapshots) charge(c *charges, total int64, op string) error {
	if total <= c.charged {
		return nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	u := ss.of(c.uid)
	if err := ss.within(c.uid, u, total-c.charged, op); err != nil {
		return err
	}
	u.bytes += total - c.charged
	ss.uids[c.uid] = u
	c.charged = total
	return nil
}

// discharge gives back what c was counted for, at its open's close.
func (ss *snapshots) discharge(c *charges) {
	if c.charged == 0 {
		return
	}
	ss.mu.Lock()
	u := ss.uids[c.uid]
	u.bytes -= c.charged
	free := ss.dropped(c.charged)
	c.charged = 0
	ss.forgetIdle(c.uid, u)
	ss.mu.Unlock()
	if free {
		go debug.FreeOSMemory()
	}
}
