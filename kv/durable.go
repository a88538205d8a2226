package kv

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/storage"
)

// commitLog makes commits durable through the write-ahead log (wal.go) and keeps badger, which
// runs managed (kv chooses each commit's version), unsynced and conflict-blind, as the
// materialised state.
//
// A commit is sequenced under mu: kv's own conflict check (every key the transaction read, found
// or not, and every key its scans returned, against the commits sequenced since its read
// version), its version (next), its record encoded and pwritten, and its writes handed to
// badger's write goroutine (CommitAt), which applies them while the commit's sync runs. It is
// acknowledged once its record is synced, whether or not badger has applied it yet: an Update
// reads what badger has yet to apply from pending, and a View waits for badger (acknowledge).
//
// Syncs are shared: a committer that finds no round running leads one, on its own thread,
// fdatasyncing every segment that holds records sequenced before the round began; committers
// arriving meanwhile wait for the next round, led by whichever of them finds none running. There
// is no sync goroutine to hand off to and wake up from.
//
// Reads: an Update reads at the last sequenced version, the writes of commits badger has yet to
// apply from pending (pending.go), so a writer sees the commit just before it, sequenced but
// perhaps neither durable nor applied, without a conflict and without waiting; a View reads at
// the same version, once it is durable and applied (leading a round if none runs), so it
// sees every commit sequenced before it began and nothing a power cut could undo. (A View that
// read only what was already durable would be linearizable too, but the engine's record cache
// counts on a View seeing every commit sequenced before it: a View that raced a commit's sync
// would otherwise put the record as it was before the commit back into the cache after the
// commit's own fill.)
//
// Every checkpointEvery commits a checkpoint syncs badger's own logs, logs the version up to
// which badger holds every commit durably, and removes the segments wholly below it.
type commitLog struct {
	dir string
	bdb *badger.DB

	// mu orders commits; seg, next, buf, recent, segments, unwritten and spare belong to it.
	mu   sync.Mutex
	next uint64
	seg  *segment
	buf  []byte
	// recent maps each key written by a commit a transaction in flight may not have seen to that
	// commit's version; pruned below the oldest read version.
	recent     map[string]uint64
	sincePrune int
	segments   []*segment // older segments still on disk
	spare      chan spareSegment
	apply      chan applyReq
	applyNow   chan struct{} // a View (or Close) needs the applier's batch now
	// applierDone is closed once the applier has handed badger every commit and ended.
	applierDone chan struct{}
	stopOnce    sync.Once

	sequenced atomic.Uint64 // the last version sequenced
	applied   watermark
	pending   pending

	// rmu guards readers, each transaction's read version, counted, so that neither recent nor
	// badger's old versions are dropped under a transaction still reading at it.
	rmu     sync.Mutex
	readers map[uint64]int

	// unwritten are the segments rotated away with records no round has written yet; mu.
	unwritten []*segment

	// smu guards the sync rounds: running, closed (no round may start: the files are closing)
	// and roundEnd.
	smu      sync.Mutex
	roundEnd *sync.Cond
	running  bool
	closed   bool
	durable  atomic.Uint64
	rounds   atomic.Uint64
	// writes and pages are the running round's: what it writes, where (its leader's alone).
	writes []pageWrite
	pages  []byte

	failed atomic.Pointer[error]

	checkpointing  atomic.Bool
	lastCheckpoint atomic.Uint64
	logs           badgerLogs // used by one checkpoint at a time
	background     sync.WaitGroup

	// quit ends the settler (settle.go), which closes settleDone as it ends (nil until the log
	// is open and the settler runs).
	quit       chan struct{}
	settleDone chan struct{}
}

// checkpointEvery is how many versions may be sequenced after a checkpoint began before the
// next one: what Open replays at most, with what the segments hold beyond it.
const checkpointEvery = 1024

// checkpointSegments is how many segments rotated away the log keeps before a checkpoint, however
// few versions they hold: 1,024 commits of 60 KB configs would otherwise keep 60 MiB of segments,
// and badger's discard version as far behind.
const checkpointSegments = 2

// applyReq is a sequenced commit for the applier to hand to badger.
type applyReq struct {
	ts     uint64
	btx    *badger.Txn
	writes []write
}

// applier hands each sequenced commit to badger, off the committer's path: badger's commit is
// a few microseconds of code a committer would run cold, and a wake of badger's write goroutine.
//
// It hands them over late, in batches, on its own clock: a commit that finds it waiting on the
// channel wakes it, and it then takes what has come every applyDelay, until quietTurns turns in a
// row bring nothing and it waits on the channel again. A View that needs badger now hurries it
// (applyNow). Applied at once, badger's commit and its writer's ran on the other CPU during the
// commit's own write, sync and reply, and a claim through the mount took 3–9 % longer on the
// benchmark's two CPUs; woken by each commit, 2–3 % (docs/performance.md, "Badger after the
// reply"). Nothing waits for a batch but a View: an Update reads what badger has yet to apply
// from pending, and the log holds it durably.
func (l *commitLog) applier() {
	defer close(l.applierDone)
	turn := time.NewTimer(applyDelay)
	turn.Stop()
	wait := func() {
		turn.Reset(applyDelay)
		select {
		case <-turn.C:
		case <-l.applyNow:
			turn.Stop()
		}
	}
	for r := range l.apply {
		wait()
		l.toBadger(r)
		// Each turn ends with the queue drained, the last one too, before the channel again.
		for quiet := 0; ; wait() {
			applied, open := l.applyQueued()
			if !open {
				return
			}
			if applied {
				quiet = 0
			} else if quiet++; quiet > quietTurns {
				break
			}
		}
	}
}

// quietTurns is how many turns without a commit the applier keeps its clock: commits that come
// closer together than ten milliseconds find it awake.
const quietTurns = 10

// applyQueued hands badger every commit queued; open is false once the log is stopping.
func (l *commitLog) applyQueued() (applied, open bool) {
	for {
		select {
		case r, open := <-l.apply:
			if !open {
				return applied, false
			}
			l.toBadger(r)
			applied = true
		default:
			return applied, true
		}
	}
}

// applyDelay is how long a batch waits: longer than a commit's write, sync and reply on the
// benchmark's disk (≈ 0.4 ms), short enough that the backlog in pending stays small. (A variable
// for the tests that make it an hour.)
var applyDelay = time.Millisecond

// toBadger has badger commit r at its version.
func (l *commitLog) toBadger(r applyReq) {
	ts, writes := r.ts, r.writes
	err := r.btx.CommitAt(ts, func(err error) {
		if err != nil {
			l.fail(fmt.Errorf("kv: badger did not apply commit %d, which the log holds: %w", ts, err))
		}
		l.pending.applied(ts, writes)
		l.applied.mark(ts)
	})
	if err != nil {
		l.fail(fmt.Errorf("kv: badger refused commit %d, which the log holds: %w", ts, err))
	}
}

type spareSegment struct {
	seg *segment
	err error
}

func newCommitLog(dir string, bdb *badger.DB) *commitLog {
	l := &commitLog{dir: dir, bdb: bdb, recent: map[string]uint64{}, readers: map[uint64]int{},
		spare: make(chan spareSegment, 1), apply: make(chan applyReq, 1024), applyNow: make(chan struct{}, 1), applierDone: make(chan struct{}), logs: badgerLogs{dir: dir},
		quit: make(chan struct{})}
	l.roundEnd = sync.NewCond(&l.smu)
	l.applied.changed = sync.NewCond(&l.applied.mu)
	return l
}

// fail makes err sticky: nothing written since can be acknowledged, so every later commit and
// read returns it.
func (l *commitLog) fail(err error) error {
	l.failed.CompareAndSwap(nil, &err)
	l.smu.Lock()
	l.roundEnd.Broadcast()
	l.smu.Unlock()
	l.applied.wake()
	return *l.failed.Load()
}

func (l *commitLog) err() error {
	if err := l.failed.Load(); err != nil {
		return *err
	}
	return nil
}

// beginRead registers a transaction's read version, the last sequenced.
func (l *commitLog) beginRead() uint64 {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	rts := l.sequenced.Load()
	l.readers[rts]++
	return rts
}

func (l *commitLog) endRead(rts uint64) {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if l.readers[rts]--; l.readers[rts] == 0 {
		delete(l.readers, rts)
	}
}

// oldestRead is the oldest read version in flight, or, with none, the last sequenced: no
// transaction can begin below it.
func (l *commitLog) oldestRead() uint64 {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	oldest := l.sequenced.Load()
	for rts := range l.readers {
		oldest = min(oldest, rts)
	}
	return oldest
}

var errConflict = errors.New("kv: conflict")

// sequence commits t: errConflict if a key it read was written by a commit sequenced after its
// read version; otherwise its version, once its record is written and badger has it.
func (l *commitLog) sequence(t *txn) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.err(); err != nil {
		return 0, err
	}
	for _, key := range t.reads {
		if l.recent[key] > t.rts {
			return 0, errConflict
		}
	}
	ts := l.next
	l.buf = appendRecord(l.buf[:0], &record{ts: ts, synced: l.durable.Load(), kind: kindCommit, writes: t.writes})
	if err := l.place(ts, l.buf); err != nil {
		return 0, err
	}
	l.next++
	for _, w := range t.writes {
		l.recent[w.key] = ts
	}
	l.pending.add(ts, t.writes)
	l.apply <- applyReq{ts: ts, btx: t.btx, writes: t.writes}
	t.btx = nil // the applier's now
	l.sequenced.Store(ts)
	if l.sincePrune++; l.sincePrune >= 256 {
		l.sincePrune = 0
		oldest := l.oldestRead()
		for key, ts := range l.recent {
			if ts <= oldest {
				delete(l.recent, key)
			}
		}
	}
	due := ts-l.lastCheckpoint.Load() >= checkpointEvery || len(l.segments) >= checkpointSegments
	if due && l.checkpointing.CompareAndSwap(false, true) {
		l.background.Add(1)
		go l.checkpoint()
	}
	return ts, nil
}

// place copies the record of version ts into the current segment's window, or the next
// segment's if it does not fit; an error (no spare segment) leaves the log as it was. mu is held.
func (l *commitLog) place(ts uint64, rec []byte) error {
	off := placeRecord(l.seg.off, len(rec))
	if off < 0 {
		if err := l.rotate(); err != nil {
			return err
		}
		if off = placeRecord(0, len(rec)); off < 0 {
			return fmt.Errorf("kv: a commit of %d bytes does not fit in a log segment", len(rec))
		}
	}
	l.seg.put(rec, off)
	l.seg.last = ts
	return nil
}

// rotate moves on to the spare segment and has the one after it prepared. mu is held.
func (l *commitLog) rotate() error {
	spare := <-l.spare
	if spare.err != nil {
		// Nothing is sequenced yet: this commit fails, a later one tries a new spare.
		l.prepareSpare(l.seg.index + 1)
		if errors.Is(spare.err, unix.ENOSPC) {
			return fmt.Errorf("%w: %w", spare.err, storage.ErrNoSpace)
		}
		return spare.err
	}
	l.unwritten = append(l.unwritten, l.seg)
	l.segments = append(l.segments, l.seg)
	l.seg = spare.seg
	l.prepareSpare(spare.seg.index + 1)
	return nil
}

// prepareSpare writes the next segment in the background: zeroing 4 MiB and syncing it must not
// hold up a commit.
func (l *commitLog) prepareSpare(index uint64) {
	l.background.Add(1)
	go func() {
		defer l.background.Done()
		seg, err := createSegment(l.dir, index)
		l.spare <- spareSegment{seg, err}
	}()
}

// waitDurable returns once the record of version ts is synced, leading a round if none runs.
func (l *commitLog) waitDurable(ts uint64) error {
	if l.durable.Load() >= ts {
		return l.err()
	}
	l.smu.Lock()
	defer l.smu.Unlock()
	for {
		if err := l.err(); err != nil {
			return err
		}
		if l.durable.Load() >= ts {
			return nil
		}
		if l.running {
			l.roundEnd.Wait()
			continue
		}
		if l.closed {
			return errClosed
		}
		l.running = true
		l.smu.Unlock()
		target, err := l.round()
		l.rounds.Add(1)
		l.smu.Lock()
		l.running = false
		if err == nil {
			l.durable.Store(target)
		}
		l.roundEnd.Broadcast()
		if err != nil {
			l.smu.Unlock()
			l.fail(err)
			l.smu.Lock()
		}
	}
}

// pageWrite is part of a segment a round writes: whole pages from at.
type pageWrite struct {
	seg   *segment
	at    int
	pages []byte
}

// round makes every record sequenced so far durable and returns the last one's version: the
// pages holding records no round wrote yet, copied under mu, are written with one pwrite a
// segment and the segments fdatasync'd. Only the round's leader runs it.
func (l *commitLog) round() (uint64, error) {
	l.mu.Lock()
	target := l.sequenced.Load()
	writes, buf := l.writes[:0], l.pages[:0]
	for _, s := range append(l.unwritten, l.seg) {
		var w pageWrite
		var ok bool
		if w, buf, ok = s.take(buf); ok {
			writes = append(writes, w)
		}
	}
	l.pages = buf
	clear(l.unwritten)
	l.unwritten = l.unwritten[:0]
	l.writes = writes
	l.mu.Unlock()
	for _, w := range writes {
		if err := pwriteAll(w.seg.file, w.pages, w.at); err != nil {
			return 0, fmt.Errorf("kv: write the log: %w", err)
		}
	}
	if err := syncRound(writes); err != nil {
		return 0, err
	}
	return target, nil
}

// acknowledge returns once the commit of version ts is durable and applied: what a View waits for
// before it reads badger.
func (l *commitLog) acknowledge(ts uint64) error {
	if err := l.waitDurable(ts); err != nil {
		return err
	}
	if l.applied.load() < ts {
		l.hurryApplier()
	}
	return l.applied.wait(ts, l.err)
}

// hurryApplier ends the applier's wait for its batch, or its next one's.
func (l *commitLog) hurryApplier() {
	select {
	case l.applyNow <- struct{}{}:
	default: // asked already
	}
}

// logCheckpoint sequences a checkpoint record saying badger holds every version up to c durably,
// and returns its version.
func (l *commitLog) logCheckpoint(c uint64) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.err(); err != nil {
		return 0, err
	}
	ts := l.next
	l.buf = appendRecord(l.buf[:0], &record{ts: ts, synced: l.durable.Load(), kind: kindCheckpoint, checkpoint: c})
	if err := l.place(ts, l.buf); err != nil {
		return 0, err
	}
	l.next++
	l.applied.mark(ts) // nothing for badger to apply
	l.sequenced.Store(ts)
	return ts, nil
}

// checkpoint makes badger's files durable up to what it has applied, logs that, and removes the
// segments the log no longer needs.
func (l *commitLog) checkpoint() {
	defer l.background.Done()
	defer l.checkpointing.Store(false)
	l.lastCheckpoint.Store(l.sequenced.Load())
	c := l.applied.load()
	if err := l.logs.sync(); err != nil {
		if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
			// Out of descriptors for a moment (the process's, or the system's): the directory or
			// a log could not be opened, so nothing this checkpoint would log was synced, and
			// the log keeps every commit until the next one, which a later commit starts.
			return
		}
		l.fail(fmt.Errorf("kv: checkpoint: sync badger's logs: %w", err))
		return
	}
	ts, err := l.logCheckpoint(c)
	if err == nil {
		err = l.waitDurable(ts)
	}
	if err != nil {
		return
	}
	l.mu.Lock()
	var remove []*segment
	kept := l.segments[:0]
	for _, s := range l.segments {
		if s.last <= c {
			remove = append(remove, s)
		} else {
			kept = append(kept, s)
		}
	}
	l.segments = kept
	l.mu.Unlock()
	for _, s := range remove {
		// Written and synced by the round that made the checkpoint durable, which began after
		// the segment was rotated away: no round will touch it again.
		s.close()
		if err := os.Remove(s.file.Name()); err != nil {
			l.fail(fmt.Errorf("kv: checkpoint: %w", err))
			return
		}
	}
	// Versions below a checkpoint are never replayed, and none a transaction still reads at.
	l.bdb.SetDiscardTs(min(c, l.oldestRead()))
}

// finalCheckpoint logs, once badger is closed, that its files hold every commit applied.
func (l *commitLog) finalCheckpoint() error {
	if l.err() != nil {
		return nil // reported already; the next Open replays the log
	}
	ts, err := l.logCheckpoint(l.applied.load())
	if err != nil {
		return err
	}
	return l.waitDurable(ts)
}

// stop ends the applier and waits for the background work: badger is then the log's alone to
// close. No commit may begin after it.
func (l *commitLog) stop() {
	l.stopOnce.Do(func() {
		// The settler checkpoints through the applier and compacts badger: it ends first.
		close(l.quit)
		if l.settleDone != nil {
			<-l.settleDone
		}
		// Closed first, then hurried: the wake the hurry leaves is taken after the close, so the
		// applier's next look at the channel finds it closed. Hurried first, a turn could take
		// the wake, find the channel still open and wait out a whole applyDelay.
		close(l.apply)
		l.hurryApplier()
		<-l.applierDone
	})
	l.background.Wait()
}

// close releases the log's files once the background work is done and no sync round runs, nor
// will: a round writing through a closed file's descriptor, reused meanwhile, would write into
// another file.
func (l *commitLog) close() {
	l.stop()
	l.smu.Lock()
	for l.running {
		l.roundEnd.Wait()
	}
	l.closed = true
	l.smu.Unlock()
	select {
	case s := <-l.spare:
		if s.seg != nil {
			s.seg.close()
		}
	default:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seg != nil {
		l.seg.close()
	}
	for _, s := range l.segments {
		s.close()
	}
	l.logs.close()
}

// watermark is the version up to which every commit is applied; badger's callbacks may come out
// of order.
type watermark struct {
	mu      sync.Mutex
	changed *sync.Cond
	upTo    atomic.Uint64
	ahead   map[uint64]bool
	waiting int
}

func (w *watermark) load() uint64 { return w.upTo.Load() }

func (w *watermark) mark(ts uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	up := w.upTo.Load()
	if ts != up+1 {
		if w.ahead == nil {
			w.ahead = map[uint64]bool{}
		}
		w.ahead[ts] = true
		return
	}
	for up++; w.ahead[up+1]; up++ {
		delete(w.ahead, up+1)
	}
	w.upTo.Store(up)
	if w.waiting > 0 {
		w.changed.Broadcast()
	}
}

func (w *watermark) wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.changed.Broadcast()
}

// wait returns once ts is applied, or failed says the store failed.
func (w *watermark) wait(ts uint64, failed func() error) error {
	if w.upTo.Load() >= ts {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiting++
	defer func() { w.waiting-- }()
	for w.upTo.Load() < ts {
		if err := failed(); err != nil {
			return err
		}
		w.changed.Wait()
	}
	return nil
}

// badgerLogs syncs badger's own logs at a checkpoint: every memtable log (*.mem) and value log
// (*.vlog) in the directory. badger's DB.Sync is no substitute: it syncs only the current
// memtable's log, and one rotated away but not yet flushed to a table would be left unsynced. A
// log gone since the listing was flushed to a table badger synced before removing it.
type badgerLogs struct {
	dir   string
	files map[string]*os.File
	// allocated names the memtable logs given their blocks.
	allocated map[string]bool
}

func (b *badgerLogs) sync() error {
	if b.files == nil {
		b.files, b.allocated = map[string]*os.File{}, map[string]bool{}
	}
	entries, err := os.ReadDir(b.dir)
	if err != nil {
		return err
	}
	present := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		isMem := strings.HasSuffix(name, ".mem")
		if !isMem && !strings.HasSuffix(name, ".vlog") {
			continue
		}
		present[name] = true
		f, ok := b.files[name]
		if !ok {
			f, err = os.OpenFile(filepath.Join(b.dir, name), os.O_RDWR, 0)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			b.files[name] = f
		}
		// badger writes a memtable log through a memory map of a sparse file: give it its blocks
		// (see checkSpace). A failure leaves it sparse, to be tried again.
		if isMem && !b.allocated[name] {
			b.allocated[name] = allocate(f) == nil
		}
		if err := datasync(f); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	for name, f := range b.files {
		if !present[name] {
			f.Close()
			delete(b.files, name)
			delete(b.allocated, name)
		}
	}
	return nil
}

func (b *badgerLogs) close() {
	for name, f := range b.files {
		f.Close()
		delete(b.files, name)
	}
}
