package kv

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/cockpitfs/cockpitfs/internal/memlimit"
)

// A store that was written and then left idle settles, so that what a burst of writes left
// behind (3,000 cockpits of 60 KB configs made and removed: 100 MiB of tables and log segments on
// disk, 300 MiB of RSS) does not stay for the rest of the daemon's life:
//
//   - once no commit has come for settleIdle, a checkpoint makes badger's files durable up to the
//     last commit and moves badger's discard version up to it (every older version of a key, and
//     a deleted key, may then be dropped), removes the log segments, and a compaction of level 0
//     into the level below rewrites the tables it overlaps without what was dropped;
//   - badger's memtable is flushed into level 0 and a new, empty one takes its place, made
//     where the Go heap has just given its free pages back (renewMemtable): what the
//     memtable held (its arena, up to 5.2 MiB, and its log's map) leaves memory;
//   - the caches of a store being written (pending's latest versions, the keys recently written
//     that a conflict check looks up) are emptied: a map keeps the room of its busiest moment;
//   - settleRelease later, once badger's pool of table builders has let go of the buffers the
//     compactions grew (it frees one every 2 s it was not asked for one, and holds at most 8), the
//     Go heap is collected twice and its free pages returned to the kernel (debug.FreeOSMemory):
//     the collector would otherwise run only at its 2-minute tick, and the runtime return them
//     over minutes after that. Twice, because what a sync.Pool kept from the burst (go-fuse's
//     request buffers, encoders' states) outlives one collection as the pool's victim: after
//     10,000 operations the settled daemon's anonymous RSS was 7.2 MiB against 7.6 with one.
//
// A store being written to all the time does none of this: the checkpoints every checkpointEvery
// commits or checkpointSegments segments bound its log, and badger's own compactions its tables.
var (
	settleIdle    = 5 * time.Second
	settleRelease = 20 * time.Second
	settleRetry   = time.Second
)

// settler settles the store after each burst of commits, polling every settleIdle: a commit
// path that armed a timer would pay for it on every commit. settleRelease after a settle, if no
// commit came since, the heap's free pages go back to the kernel — on a timer of their own, not at
// the next poll, which would add up to settleIdle to when an idle daemon is small again. A settle
// that could not run (a checkpoint or a flush was under way) is tried again settleRetry later, not
// at the next poll. It ends when quit is closed.
func (l *commitLog) settler() {
	defer close(l.settleDone)
	poll := time.NewTicker(settleIdle)
	defer poll.Stop()
	release := time.NewTimer(settleRelease)
	release.Stop()
	defer release.Stop()
	retry := time.NewTimer(settleRetry)
	retry.Stop()
	defer retry.Stop()
	seen := l.sequenced.Load()
	settled := seen // the last version sequenced when the store last settled
	for {
		select {
		case <-l.quit:
			return
		case <-release.C:
			if l.err() == nil && l.sequenced.Load() == settled {
				runtime.GC() // the pools' victims (above)
				debug.FreeOSMemory()
			}
			continue
		case <-poll.C:
		case <-retry.C:
		}
		if l.err() != nil {
			return
		}
		now := l.sequenced.Load()
		switch {
		case now != seen: // commits since the last poll: not idle yet
			seen = now
		case now != settled:
			if !l.settle() {
				retry.Reset(settleRetry)
				continue
			}
			settled = l.sequenced.Load() // past the settle's own checkpoint record
			seen = settled
			release.Reset(settleRelease)
		}
	}
}

// settle checkpoints and compacts level 0 away; false if a checkpoint was already running or
// badger was still flushing a full memtable into level 0, whose table the compaction would miss.
func (l *commitLog) settle() bool {
	if mems, _ := filepath.Glob(filepath.Join(l.dir, "*.mem")); len(mems) > 1 {
		return false // each memtable badger has yet to flush keeps its log
	}
	if !l.checkpointing.CompareAndSwap(false, true) {
		return false
	}
	l.background.Add(1)
	l.checkpoint()
	if l.err() != nil {
		return true
	}
	if err := l.renewMemtable(); err != nil {
		l.bdb.Opts().Logger.Warningf("settling the store: renewing the memtable: %v", err)
	}
	// Flatten compacts every level but the lowest one holding tables into it, through
	// badger's own compaction (which keeps a version any read may still see): with the
	// engine's few MiB of live data, level 0 and one level below.
	if err := l.bdb.Flatten(1); err != nil {
		l.bdb.Opts().Logger.Warningf("settling the store: %v", err)
	}
	l.pending.forget()
	l.mu.Lock()
	oldest := l.oldestRead()
	recent := map[string]uint64{}
	for key, ts := range l.recent {
		if ts > oldest {
			recent[key] = ts
		}
	}
	l.recent = recent
	l.mu.Unlock()
	return true
}

// renewalRoom is what a memtable renewal may allocate before a collection: badger flushes the old
// memtable into a table (builder buffers of about its size) and then makes the new one's arena
// (5.2 MiB for a 4 MiB memtable), which no collection may come before. The collector may begin a
// cycle as early as 70 % of the way to the limit: ≈ 22 MiB here, twice what comes before the arena.
const renewalRoom = 32 << 20

// memtableMark is the key renewMemtable writes to have badger start a new memtable: badger does so
// only in DropPrefix, and only for a prefix it holds. No engine key starts with a 0xff byte.
var memtableMark = []byte("\xffkv-renew-memtable")

// renewMemtable has badger flush its memtable into level 0 and start an empty one, which a
// store left idle would otherwise keep, written part and all, for good: badger starts a new
// memtable only once one is full. The new arena (make of 5.2 MiB) is taken after the heap gave
// its free pages back, so the runtime need not zero it (pages the kernel hands back are zero)
// and only what is written into it becomes resident; an arena taken from pages the heap held
// was zeroed whole, and the idle daemon held all of it.
//
// It is not tried on a disk with less room than a commit needs (checkSpace): the memtable then
// stays as it is until the next settle. A DropPrefix that failed after the mark was written stops
// the store (below).
//
// Commits wait (mu) while it runs — the flush and a compaction of level 0, in which DropPrefix
// drops the mark — and badger is handed every one sequenced before it: DropPrefix refuses writes
// while it runs, and a commit badger refused would stop the store. The mark is written at the
// version the next commit will take, which no read sees (every read is at a version sequenced
// before); one a crash left in a memtable log is above every version the log holds, and Open's
// undoBeyond deletes it.
func (l *commitLog) renewMemtable() error {
	// The flush writes a table and the new memtable a log: not where a commit would be refused.
	d, err := os.Open(l.dir)
	if err != nil {
		return err
	}
	err = checkSpace(d, l.dir)
	d.Close()
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.err(); err != nil {
		return err
	}
	l.hurryApplier()
	if err := l.applied.wait(l.sequenced.Load(), l.err); err != nil {
		return err
	}
	debug.FreeOSMemory()
	// A collection before the arena is made would free pages the runtime then zeroes for it, whole
	// (it zeroes a span that is not all pages returned to the kernel). Turning GOGC off is not
	// enough: the soft memory limit collected during a renewal after churn, whose compactions'
	// buffers were still live, and the settled daemon then held the 5.2 MiB arena (32 MiB of RSS
	// instead of 27, one run in four). The room covers the flush's table before the arena, and the arena;
	// past it DropPrefix's compaction collects as usual: a hold without room, through the
	// compaction too, left 29 MiB in every run.
	defer memlimit.HoldCollections(renewalRoom)()
	mark := l.bdb.NewTransactionAt(l.next, true)
	defer mark.Discard()
	if err := mark.Set(memtableMark, nil); err != nil {
		return err
	}
	if err := mark.CommitAt(l.next, nil); err != nil {
		return err
	}
	if err := l.bdb.DropPrefix(memtableMark); err != nil {
		// The mark may still be in badger, at the version the next commit would take and
		// then see it at: none may come. The next Open undoes it.
		return l.fail(fmt.Errorf("kv: renewing badger's memtable: %w", err))
	}
	// The new memtable's log gets its blocks now, as the settle's checkpoint gave the old one
	// (badgerLogs.sync), not at the next checkpoint.
	mems, _ := filepath.Glob(filepath.Join(l.dir, "*.mem"))
	for _, name := range mems {
		if f, err := os.OpenFile(name, os.O_RDWR, 0); err == nil {
			allocate(f)
			f.Close()
		}
	}
	return nil
}
