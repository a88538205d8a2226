package engine

import (
	"strings"
	"sync"
	"sync/atomic"
)

// staleKeys are the keys committed since a reader that keeps what it read (health's inventory,
// the kept status) last took them: a commit marks its key as it begins and as it ends, so the
// reader reads again what changed, not every stack on the machine. Like the record cache, this
// holds only while this process is the store's only writer; over a shared store the readers read
// everything.
type staleKeys struct {
	mu    sync.Mutex      // guards stale and underway alone, so commits never wait for a reader; a leaf
	stale map[string]bool // keys committed since the last take
	// underway counts each key's commits under way: every take returns them, since the store may
	// show a commit before its committer is back.
	underway map[string]int
	// tracking: a reader has begun, so commits must be marked. Before the first take nothing is
	// kept (that reader reads everything), so a daemon nobody asks keeps no key of every stack
	// ever committed.
	tracking atomic.Bool
}

func (s *staleKeys) commitBegins(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.underway == nil {
		s.underway = map[string]int{}
	}
	s.underway[key]++
}

func (s *staleKeys) commitOrdered(string, *commitOutcome) {}

// commitEnds marks key stale; update calls it before acknowledging the commit.
func (s *staleKeys) commitEnds(key string, _ *commitOutcome) {
	s.mu.Lock()
	s.underway[key]--
	if s.underway[key] <= 0 {
		delete(s.underway, key)
	}
	s.mu.Unlock()
	s.mark(key)
}

// mark has the next take return key.
func (s *staleKeys) mark(key string) {
	if !s.tracking.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stale == nil {
		s.stale = map[string]bool{}
	}
	s.stale[key] = true
}

// take returns the keys committed since the last take, and those with commits under way, and
// starts tracking. The reader takes them before its View begins: a key marked after the take
// stays for the next one, since the View's snapshot may predate its commit. A reader whose View
// failed marks them again.
func (s *staleKeys) take() map[string]bool {
	s.tracking.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	stale := s.stale
	s.stale = nil
	for key := range s.underway {
		if stale == nil {
			stale = map[string]bool{}
		}
		stale[key] = true
	}
	return stale
}

// staleStacks are the stack keys committed since a reader that keeps what it read of every stack
// (health's inventory, the port index) last took them: the commitObserver such a reader embeds.
type staleStacks struct {
	stale staleKeys
}

func (s *staleStacks) commitBegins(key string) {
	if strings.HasPrefix(key, allStacksPrefix) {
		s.stale.commitBegins(key)
	}
}

func (s *staleStacks) commitOrdered(string, *commitOutcome) {}

func (s *staleStacks) commitEnds(key string, o *commitOutcome) {
	if strings.HasPrefix(key, allStacksPrefix) {
		s.stale.commitEnds(key, o)
	}
}
