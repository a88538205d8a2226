//go:build team

package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/internal/shell"
	"github.com/cockpitfs/cockpitfs/storage/etcdconf"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore"
)

// Team mode: a daemon, verify and migrate on an etcd prefix (docs/teams.md). Only a build with
// -tags team links the etcd client (storage/etcdstore): its packages' init alone leaves megabytes
// of the executable resident in every daemon, team or not (docs/performance.md, "Footprint").

func init() { team = etcdTeam{} }

// etcdTeam opens etcd stores.
type etcdTeam struct{}

// serve opens the etcd store st names and its engine, as openServed does a data directory.
func (etcdTeam) serve(mnt string, st storeChoice, restart string) (servedStore, error) {
	// The store is the truth of every machine sharing the prefix, so this daemon takes no
	// machine-wide port holds (a port leased through etcd is leased to one stack across all
	// of them), and etcd keeps its own copies, so there are no backups.
	db, err := openEtcd(*st.etcd)
	if err != nil {
		return servedStore{}, err
	}
	if err := unfinishedMigrationIn(db, st.url); err != nil {
		db.Close()
		return servedStore{}, err
	}
	stopSeen, err := keepSeen(db, st, mnt, restart)
	if err != nil {
		db.Close()
		return servedStore{}, err
	}
	eng, err := engine.NewShared(db)
	if err != nil {
		stopSeen()
		db.Close()
		return servedStore{}, err
	}
	eng.BoundLeases(st.leasesPerUID, uint32(os.Getuid()))
	eng.BoundCockpits(st.cockpitsPerUID, uint32(os.Getuid()))
	if err := eng.CountStacks(context.Background(), st.stacksPerUID, uint32(os.Getuid())); err != nil {
		stopSeen()
		db.Close()
		return servedStore{}, err
	}
	return servedStore{eng, "store " + st.url, func() { stopSeen(); db.Close() }, func() {}}, nil
}

// open opens an etcd prefix a migration copies from (source) or into.
func (etcdTeam) open(cfg etcdconf.Config, where string, source bool) (migrating, error) {
	s, err := openEtcd(cfg)
	if err != nil {
		return migrating{}, err
	}
	if source {
		if err := unfinishedMigrationIn(s, where); err != nil {
			s.Close()
			return migrating{}, err
		}
	}
	return migrating{s, s.Close, ""}, nil
}

// verify checks an etcd prefix, which daemons may be serving meanwhile: Verify reads one
// consistent snapshot. Port holds are per machine and not taken over etcd: none to check. It also
// compares the cluster's answer with what the daemon of the data directory data last recorded of
// it (keepSeen), naming a restore from an older snapshot or another cluster since.
func (etcdTeam) verify(cfg etcdconf.Config, url, data string) error {
	db, err := openEtcd(cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := unfinishedMigrationIn(db, url); err != nil {
		return err
	}
	var violations []string
	seen := etcdconf.SeenPath(data, cfg)
	if was, ok := etcdconf.ReadSeen(seen); ok {
		if err := was.Against(db.Seen()); err != nil {
			violations = append(violations, fmt.Sprintf("%s: %v; a daemon that served the prefix through it "+
				"refuses it (EIO, STATE_ROOT_UNAVAILABLE) from its next read on, until restarted to read it as it "+
				"is now: cockpitfs unmount %s, then %s", seen, err, shell.Quote(was.Mount), was.Restart))
		}
	}
	found, checked, err := engine.Verify(db)
	if err != nil {
		return err
	}
	return report(append(violations, found...), checked)
}

// keepSeen records, in the data directory, what the daemon sees of its etcd store, for verify and
// the next mount to compare with what the cluster answers then (etcdconf.Seen). A restore or
// another cluster since the last daemon's record is logged, and served: a daemon that starts
// reads the prefix as it is now, which is what restarting after a restore is for; the daemons
// that ran through it refuse until restarted, and verify names it until they are.
func keepSeen(db *etcdstore.Store, st storeChoice, mnt, restart string) (stop func(), err error) {
	if err := os.MkdirAll(st.data, 0o700); err != nil {
		return nil, err
	}
	path := etcdconf.SeenPath(st.data, *st.etcd)
	if was, ok := etcdconf.ReadSeen(path); ok {
		if err := was.Against(db.Seen()); err != nil {
			log.Printf("%v; serving the prefix as it is now", err)
		}
	}
	return db.KeepSeen(path, etcdconf.Seen{Store: st.url, Mount: mnt, Restart: restart})
}

// openEtcd connects to the etcd store cfg names.
func openEtcd(cfg etcdconf.Config) (*etcdstore.Store, error) {
	s, err := etcdstore.Open(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w; nothing was changed", err)
	}
	return s, nil
}
