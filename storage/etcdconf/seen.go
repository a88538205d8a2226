// Package etcdconf names an etcd store and holds what a daemon saw of it: no etcd client is in
// it, so a build of cockpitfs without team mode (cmd/cockpitfs, -tags team) links none.
package etcdconf

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// A running store refuses a cluster whose revision went backward or whose id changed (etcdstore's observe).
// A process that starts afterwards has no memory of what came before, so a daemon keeps what it
// saw of its store in its data directory, a file per store (its endpoints and prefix): the
// cluster that answered and the highest revision it answered with. `cockpitfs verify --store` and
// the next mount compare the cluster's answer now with it.
//
// The file is written at most once a second, off every operation's path, and once more when the
// daemon closes the store: a restore to a revision at or above the last one written (a snapshot
// taken within the last second of a killed daemon's life, or a restored cluster that has since
// committed past it) goes unnoticed. A revision is recorded only once etcd answered it, and etcd's
// revision never goes backward otherwise, so what is recorded never names a condition that did not
// happen. Member ids are not recorded: replacing a member changes them, and a restore with the
// same --initial-cluster and token keeps them (and the cluster id) as they were.

// Seen is what a daemon last recorded of its store.
type Seen struct {
	Store    string    `json:"store"` // endpoints and prefix, for whoever reads the file
	Cluster  uint64    `json:"cluster"`
	Revision int64     `json:"revision"`
	At       time.Time `json:"at"`
	// Mount and Restart are the daemon's mountpoint and the command that starts it again.
	Mount   string `json:"mount"`
	Restart string `json:"restart"`
}

// SeenPath is the file in the data directory dir that holds what a daemon saw of cfg's store.
// The endpoints are taken in any order.
func SeenPath(dir string, cfg Config) string {
	return filepath.Join(dir, "etcd-"+storeKey(cfg)[:16]+".seen")
}

// storeKey names cfg's store: its sorted endpoints and its prefix.
func storeKey(cfg Config) string {
	endpoints := slices.Sorted(slices.Values(cfg.Endpoints))
	sum := sha256.Sum256([]byte(strings.Join(endpoints, ",") + "/" + strings.Trim(cfg.Prefix, "/")))
	return hex.EncodeToString(sum[:])
}

// ReadSeen reads what a daemon recorded at path. A file that is missing, or does not decode (a
// write the disk lost), records nothing.
func ReadSeen(path string) (Seen, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Seen{}, false
	}
	var was Seen
	if json.Unmarshal(b, &was) != nil || was.Cluster == 0 {
		return Seen{}, false
	}
	return was, true
}

// Against names how a cluster answering now with id cluster at revision contradicts what was
// seen; nil when it does not.
func (was Seen) Against(cluster uint64, revision int64) error {
	when := was.At.UTC().Format(time.RFC3339)
	switch {
	case cluster != was.Cluster:
		return fmt.Errorf("another etcd cluster answers at %s: cluster %x, where the daemon of this data directory saw cluster %x (at revision %d, %s)", was.Store, cluster, was.Cluster, was.Revision, when)
	case revision < was.Revision:
		return fmt.Errorf("the store's revision went backward from %d to %d: %s was restored from an older snapshot? (the daemon of this data directory saw revision %d at %s)", was.Revision, revision, was.Store, was.Revision, when)
	}
	return nil
}

// WriteSeen replaces path with rec, whole: a crash leaves the old record or the new one.
func WriteSeen(path string, rec Seen) error {
	rec.At = time.Now()
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("recording what etcd answered in %s: %w", path, err)
	}
	return nil
}
