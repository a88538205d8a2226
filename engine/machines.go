package engine

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/liveness"
	"github.com/cockpitfs/cockpitfs/storage"
)

// MachineTTL is how long a shared store keeps a machine alive after its last daemon stopped
// renewing it: then its holders and drain executors read dead, and the next claim anywhere
// releases them.
const MachineTTL = 10 * time.Second

// machines judges processes of other machines sharing the store. A process's start identity names
// its boot; a process of this boot is probed here, one of another boot is alive while a daemon of
// that boot keeps its announcement (m/<boot id>/<daemon>) in the store.
type machines struct {
	db   storage.Shared
	boot string
	key  string // this daemon's announcement
}

// announceMachine announces this daemon's boot in db for as long as it runs.
func announceMachine(db storage.Shared) (*machines, error) {
	boot, err := liveness.BootID()
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	daemon := fmt.Sprintf("%s-%d-%d", host, os.Getpid(), time.Now().UnixNano())
	key := machineKey(boot, daemon)
	if err := db.Announce(key, MachineTTL); err != nil {
		return nil, err
	}
	return &machines{db: db, boot: boot, key: key}, nil
}

// proveMachine is asked before an operation that creates or keeps a holder of this machine: other
// daemons judge that holder's process alive only while this machine is announced, so this
// daemon must know it is — after a pause (SIGSTOP, a suspended VM, a long GC) the announcement
// may have expired unnoticed, and a holder made then would read dead elsewhere at once and be
// released by the next claim there. It renews the announcement unless renewed within half its
// TTL, writing it again if it expired; until the store answers, the operation is refused.
// Over this daemon's own store there is nothing to prove.
func (e *Engine) proveMachine() error {
	if e.machines == nil {
		return nil
	}
	if err := e.machines.db.Prove(e.machines.key); err != nil {
		return refuse(MachineUnannounced, "", "retry once the shared store answers; this daemon announces its machine again first",
			"this machine's announcement could not be renewed: %v", err)
	}
	return nil
}

// gone reports whether the process recorded as pid with start is proven dead. A store read that
// fails proves nothing: unknown is never dead.
func (e *Engine) gone(start string, pid int) bool {
	if e.machines != nil {
		if boot, ok := liveness.BootOf(start); ok && boot != e.machines.boot {
			return !e.machines.alive(boot)
		}
	}
	return liveness.Gone(start, liveness.Observe(pid))
}

var errAnnounced = errors.New("announced")

// alive reads whether a daemon of boot is announced; a failed read (never errAnnounced) proves
// nothing either, so it reads alive too.
func (m *machines) alive(boot string) bool {
	err := m.db.View(func(tx storage.Txn) error {
		return tx.Scan(machinesPrefix(boot), func(string, []byte) error { return errAnnounced })
	})
	return err != nil
}
