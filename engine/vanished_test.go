package engine

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestVanishedBetween(t *testing.T) {
	h := func(name string) Holder { return Holder{Name: name, HolderID: holderID(name)} }
	sorted := func(hs ...Holder) []Holder {
		slices.SortFunc(hs, func(a, b Holder) int { return strings.Compare(a.HolderID, b.HolderID) })
		return hs
	}
	// The names as a commit lists them: in the holders' id order.
	idOrder := func(hs ...Holder) (names []string) {
		for _, h := range sorted(hs...) {
			names = append(names, h.Name)
		}
		return names
	}
	leased := &Lease{Offset: 0, Ports: map[string]int{"HTTP": 38000}}
	record := func(lease *Lease, hs ...Holder) Record {
		return Record{Cockpit: "app", Stack: "s", Value: Value{Lease: lease, Holders: sorted(hs...)}}
	}
	released := *leased
	released.Released = true
	for _, c := range []struct {
		name       string
		prev, next Record
		want       Vanished
		ok         bool
	}{
		{"a claim adds one", record(leased, h("a")), record(leased, h("a"), h("b")), Vanished{}, false},
		{"a holder rewritten in place", record(leased, h("a"), h("b")), record(leased, h("a"), h("b")), Vanished{}, false},
		{"a dead holder released for a new one", record(leased, h("a"), h("dead")), record(leased, h("a"), h("new")),
			Vanished{Cockpit: "app", Stack: "s", Holders: []string{"dead"}}, true},
		{"a drain ends holders and lease", record(leased, h("a"), h("b")), record(&released),
			Vanished{Cockpit: "app", Stack: "s", Holders: idOrder(h("a"), h("b")), Ports: leased.Ports}, true},
	} {
		got, ok := vanishedBetween(c.prev, c.next)
		if ok != c.ok || ok && !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: vanishedBetween = %+v %v, want %+v %v", c.name, got, ok, c.want, c.ok)
		}
	}
}
