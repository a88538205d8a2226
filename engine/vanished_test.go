package engine

import (
	"context"
	"reflect"
	"sync"
	"testing"
)

// Each durable commit that releases holders tells OnVanished which: a release the name it
// released, a claim the dead holders it released, a drain its holders; a commit that releases
// none, and a refused one, tell nothing.
func TestOnVanishedNamesTheReleasedHolders(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	var mu sync.Mutex
	var told []Vanished
	e.OnVanished(func(_ context.Context, v Vanished) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, v)
	})
	take := func() []Vanished {
		mu.Lock()
		defer mu.Unlock()
		got := told
		told = nil
		return got
	}
	newCockpit(t, e, "app", exampleConfig, "s")
	claim(t, e, "app", "s", "me")
	claim(t, e, "app", "s", "bob")
	claim(t, e, "app", "s", "carol")
	if got := take(); got != nil {
		t.Fatalf("claims that released nobody told %+v", got)
	}

	if err := e.Release(context.Background(), me("unlink", "app/stacks/s/holders/bob"), "app", "s", "bob"); err != nil {
		t.Fatal(err)
	}
	if got, want := take(), []Vanished{{Cockpit: "app", Stack: "s", Holders: []string{"bob"}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("the release told %+v, want %+v", got, want)
	}

	worker := sessionSleeper(t)
	claimWithPID(t, e, "app", "s", "worker", worker.Process.Pid)
	kill(t, worker)
	claim(t, e, "app", "s", "dave")
	if got, want := take(), []Vanished{{Cockpit: "app", Stack: "s", Holders: []string{"worker"}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("the claim that released a dead holder told %+v, want %+v", got, want)
	}

	// A refused release commits nothing and tells nothing.
	if err := e.Release(context.Background(), me("unlink", "app/stacks/s/holders/bob"), "app", "s", "bob"); err == nil {
		t.Fatal("a second release of bob succeeded")
	}
	if got := take(); got != nil {
		t.Fatalf("a refused release told %+v", got)
	}

	// A drain (by its only holder: it refuses co-tenants) releases the last one.
	for _, name := range []string{"carol", "dave"} {
		if err := e.Release(context.Background(), me("unlink", "app/stacks/s/holders/"+name), "app", "s", name); err != nil {
			t.Fatal(err)
		}
	}
	take()
	drainS(t, e)
	if got, want := take(), []Vanished{{Cockpit: "app", Stack: "s", Holders: []string{"me"}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("the drain told %+v, want %+v", got, want)
	}
}
