package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// peerStore is the seeds' way to commit a coordination record, done in Go on the same disk: a lock
// file taken with O_EXCL, the record read and changed, the next one written to a temporary file,
// fsync'd, renamed over the record, the directory fsync'd, the lock removed. Go instead of Node
// leaves out the peer's process start and interpreter: the figure is the peer's floor.
type peerStore struct {
	dir    string
	record string
	lock   string
	tmp    string
}

func newPeerStore(dir string, initial []byte) (*peerStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &peerStore{
		dir:    dir,
		record: filepath.Join(dir, "stack.json"),
		lock:   filepath.Join(dir, ".lock"),
		tmp:    filepath.Join(dir, fmt.Sprintf(".stack.json.%d.tmp", os.Getpid())),
	}
	return p, os.WriteFile(p.record, initial, 0o600)
}

// update is one transaction: change gets the record's JSON value and changes it in place.
func (p *peerStore) update(change func(record map[string]any) error) error {
	lock, err := unix.Open(p.lock, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("peer lock: %w", err)
	}
	unix.Write(lock, []byte(fmt.Sprintf("%d\n", os.Getpid())))
	unix.Close(lock)
	defer os.Remove(p.lock)
	data, err := os.ReadFile(p.record)
	if err != nil {
		return err
	}
	var record map[string]any
	if err := json.Unmarshal(data, &record); err != nil {
		return err
	}
	if err := change(record); err != nil {
		return err
	}
	next, err := json.MarshalIndent(record, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.OpenFile(p.tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := tmp.Write(next); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(p.tmp, p.record); err != nil {
		return err
	}
	dir, err := os.Open(p.dir)
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}

// claim adds a holder to the record's value.holders and bumps its revision, as a claim does.
// addPeerHolder appends holder name to a peer record's value, as the seeds' claim writes it.
func addPeerHolder(value map[string]any, name string) {
	holders, _ := value["holders"].([]any)
	value["holders"] = append(holders, map[string]any{
		"holderId":     "holder:" + name + ":session",
		"checkoutId":   "checkout:" + name,
		"claimedAt":    time.Now().UTC().Format("2006-01-02T15:04:05.000Z"),
		"pid":          os.Getpid(),
		"processStart": "proc:boot:1",
		"name":         name,
	})
}

func (p *peerStore) claim(name string) error {
	return p.update(func(r map[string]any) error {
		value, ok := r["value"].(map[string]any)
		if !ok {
			return fmt.Errorf("peer record has no value")
		}
		addPeerHolder(value, name)
		bump(r)
		return nil
	})
}

// release drops the named holder again.
func (p *peerStore) release(name string) error {
	return p.update(func(r map[string]any) error {
		value := r["value"].(map[string]any)
		holders, _ := value["holders"].([]any)
		kept := holders[:0]
		for _, h := range holders {
			if h.(map[string]any)["name"] != name {
				kept = append(kept, h)
			}
		}
		value["holders"] = kept
		bump(r)
		return nil
	})
}

func bump(r map[string]any) {
	rev, _ := r["revision"].(float64)
	r["revision"] = rev + 1
	r["updatedAt"] = time.Now().UTC().Format("2006-01-02T15:04:05.000Z")
}
