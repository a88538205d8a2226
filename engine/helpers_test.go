package engine

import (
	"context"
	"os"
	"testing"

	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
)

// newEngine opens an engine over a real badger store in a temp dir.
func newEngine(t *testing.T) *Engine {
	t.Helper()
	db, err := kv.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return New(db)
}

// me is the test process as a caller.
func me(op, path string) Caller {
	return Caller{PID: os.Getpid(), UID: uint32(os.Getuid()), Op: op, Path: path}
}

const exampleConfig = `[ports]
step = 10
count = 20
[ports.bases]
HTTP = 18080
DB = 15432
`

// newCockpit creates cockpit name with config text and the named stacks.
func newCockpit(t *testing.T, e *Engine, name, config string, stacks ...string) {
	t.Helper()
	ctx := context.Background()
	if err := e.CreateCockpit(ctx, me("mkdir", name), name); err != nil {
		t.Fatal(err)
	}
	if config != "" {
		if err := e.SetConfig(ctx, me("write", name+"/config"), name, []byte(config)); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range stacks {
		if err := e.CreateStack(ctx, me("mkdir", name+"/stacks/"+s), name, s); err != nil {
			t.Fatal(err)
		}
	}
}

// untracked claims for holder without a pid, checked out at /src/<holder>.
func untracked(holder string) *Holder {
	return &Holder{CheckoutPath: "/src/" + holder}
}

// events returns the events lines of a stack, or of the cockpit itself when stack is "".
func (e *Engine) events(cockpit, stack string) ([]byte, error) {
	if stack == "" {
		stack = cockpitLevel
	}
	var out []byte
	err := e.db.View(func(tx storage.Txn) (err error) {
		out, err = readEvents(tx, cockpit, stack)
		return err
	})
	return out, err
}
