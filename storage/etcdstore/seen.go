package etcdstore

import (
	"time"

	"github.com/cockpitfs/cockpitfs/storage/etcdconf"
)

// Seen returns the cluster that answered this store and the highest revision it answered with.
func (s *Store) Seen() (cluster uint64, revision int64) {
	return s.clusterID.Load(), s.seen.Load()
}

// seenInterval is how often KeepSeen writes what changed.
const seenInterval = time.Second

// KeepSeen records what the store has seen at path, with rec's Store, Mount and Restart: now,
// then at most once a second while it changes, and once more when stop is called. A revoked
// store has stopped seeing, so what is recorded stays what it saw before.
func (s *Store) KeepSeen(path string, rec etcdconf.Seen) (stop func(), err error) {
	rec.Cluster, rec.Revision = s.Seen()
	if err := etcdconf.WriteSeen(path, rec); err != nil {
		return nil, err
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(seenInterval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if cluster, rev := s.Seen(); cluster != rec.Cluster || rev != rec.Revision {
				rec.Cluster, rec.Revision = cluster, rev
				_ = etcdconf.WriteSeen(path, rec) // the next tick tries again; the older record stands
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
		rec.Cluster, rec.Revision = s.Seen()
		_ = etcdconf.WriteSeen(path, rec)
	}, nil
}
