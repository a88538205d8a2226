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
)

// groupSync makes commits durable in groups. Badger runs with SyncWrites off, so a commit returns
// once its entries are in the memory-mapped write-ahead log of the memtable (*.mem); one
// fdatasync of those logs then acknowledges every commit that returned before it began.
//
// Badger's own SyncWrites costs two device flushes per commit (its value log, even when nothing
// was written to it, then the WAL) and one WAL sync per transaction even when many wait
// together. Its DB.Sync is no substitute: it syncs only the current memtable's WAL, and a rotation
// to a new memtable (ensureRoomForWrite) leaves the previous one unsynced until it is flushed to
// a table. So every *.mem still in the directory is synced here; one that is gone was flushed to a
// table badger synced before deleting it.
//
// The value log is synced too when a commit wrote a value at or above the value threshold (only
// those go there); records are far below it, so it normally costs nothing.
//
// Reads must not see a commit before it is durable, or a power cut could undo what a reader
// acted on: visible waits until every commit that began before it is synced or abandoned.
type groupSync struct {
	dir string

	mu      sync.Mutex
	changed *sync.Cond
	next    uint64          // last ticket handed out
	waiting map[uint64]bool // tickets not yet durable: true once their commit returned
	vlog    bool            // a waiting commit wrote to the value log
	running bool            // a round is syncing
	err     error           // a failed sync: nothing written since can be acknowledged
	files   map[string]*os.File
	// allocated names the memtable logs given their blocks.
	allocated map[string]bool

	rounds atomic.Uint64
}

func newGroupSync(dir string) *groupSync {
	g := &groupSync{dir: dir, waiting: map[uint64]bool{}, files: map[string]*os.File{}, allocated: map[string]bool{}}
	g.changed = sync.NewCond(&g.mu)
	return g
}

// begin hands out the ticket of a commit about to start.
func (g *groupSync) begin() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.next++
	g.waiting[g.next] = false
	return g.next
}

// abandon releases the ticket of a commit that wrote nothing.
func (g *groupSync) abandon(ticket uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.waiting, ticket)
	g.changed.Broadcast()
}

// durable returns once the commit of ticket, which has returned, is on disk: synced by a round
// that began after it, led by whichever waiting committer finds no round running.
func (g *groupSync) durable(ticket uint64, wroteValueLog bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.waiting[ticket] = true
	g.vlog = g.vlog || wroteValueLog
	for {
		if g.err != nil {
			delete(g.waiting, ticket)
			g.changed.Broadcast()
			return g.err
		}
		if _, ok := g.waiting[ticket]; !ok {
			return nil
		}
		if g.running {
			g.changed.Wait()
			continue
		}
		var round []uint64
		for t, returned := range g.waiting {
			if returned {
				round = append(round, t)
			}
		}
		vlog := g.vlog
		g.vlog = false
		g.running = true
		g.mu.Unlock()
		err := g.syncLogs(vlog)
		g.mu.Lock()
		g.running = false
		if err != nil {
			g.err = fmt.Errorf("kv: sync: %w", err)
		}
		for _, t := range round {
			delete(g.waiting, t)
		}
		g.changed.Broadcast()
		if err != nil {
			return g.err
		}
	}
}

// visible returns once no commit that began before it awaits its sync.
func (g *groupSync) visible() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	last := g.next
	for g.err == nil && g.awaits(last) {
		g.changed.Wait()
	}
	return g.err
}

func (g *groupSync) awaits(last uint64) bool {
	for t := range g.waiting {
		if t <= last {
			return true
		}
	}
	return false
}

// syncLogs fdatasyncs every memtable log in the directory, and the value logs if asked. Only the
// round's leader runs it, so files needs no lock of its own.
func (g *groupSync) syncLogs(vlog bool) error {
	g.rounds.Add(1)
	entries, err := os.ReadDir(g.dir)
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
		if !isMem && !vlog {
			continue
		}
		f, ok := g.files[name]
		if !ok {
			f, err = os.OpenFile(filepath.Join(g.dir, name), os.O_RDWR, 0)
			if errors.Is(err, fs.ErrNotExist) {
				continue // flushed to a table and deleted since the listing
			}
			if err != nil {
				return err
			}
			g.files[name] = f
		}
		// A memtable log is seen here first in the commit that created it (see allocate). A
		// failure leaves it sparse, to be tried again; checkSpace is the guard that matters.
		if isMem && !g.allocated[name] {
			g.allocated[name] = allocate(f) == nil
		}
		if err := datasync(f); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	for name, f := range g.files {
		if !present[name] {
			f.Close()
			delete(g.files, name)
			delete(g.allocated, name)
		}
	}
	return nil
}

// close releases the open logs.
func (g *groupSync) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for name, f := range g.files {
		f.Close()
		delete(g.files, name)
	}
}
