package etcdstore

import "time"

// AgeAnnouncement moves the last proof of key back by d, as if d had passed since, and returns
// when it now was (the boot-time clock).
func (s *Store) AgeAnnouncement(key string, d time.Duration) time.Duration {
	v, _ := s.announcements.Load(key)
	a := v.(*announcement)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.proven -= d
	return a.proven
}

// QuorumAnsweredNow records that a quorum answered just now, as the read before an operation
// would have: its Update is tried on the watched copy first (tryOptimistic).
func (s *Store) QuorumAnsweredNow() { s.answered(bootClock()) }

// LeaderEndpoint is the endpoint the store's operations are sent to, "" for every endpoint.
func (s *Store) LeaderEndpoint() string {
	if l := s.leading(); l != nil {
		return l.endpoint
	}
	return ""
}

// QuorumAnsweredLongAgo forgets when a quorum last answered: the next Update reads before it
// commits.
func (s *Store) QuorumAnsweredLongAgo() { s.quorum.Store(0) }

// SendTo has the store send its operations to endpoint, as if it had found that member leading.
func (s *Store) SendTo(endpoint string) {
	l := s.leading()
	s.pin(endpoint, l.term.Load()+1)
}

// HeldValueBytes is how many bytes of values the store's cache holds.
func (s *Store) HeldValueBytes() int {
	s.cache.mu.Lock()
	defer s.cache.mu.Unlock()
	n := 0
	for _, vs := range s.cache.versions {
		for _, v := range vs {
			n += len(v.value)
		}
	}
	return n
}
