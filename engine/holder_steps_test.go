package engine

import (
	"errors"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
)

// The claim, holder-write and release steps on records built in memory: no store, no processes.

// fakeReads serves a step's reads from fields and records which were made.
type fakeReads struct {
	meta    cockpitMeta
	missing bool
	active  int
	// uidLeases are the claimant uid's active leases.
	uidLeases int
	owners    map[int]string
	// leased are the cockpit's leased ports; leasedKnown false: a store from before they were kept.
	leased      []int
	leasedKnown bool
	err         error // returned by every index read
	made        []string
	previous    string // why the stack's previous family was passed
}

func (f *fakeReads) cockpit() (cockpitMeta, error) {
	f.made = append(f.made, "cockpit")
	if f.missing {
		return cockpitMeta{}, refuse(NotFound, "", "", "cockpit app does not exist")
	}
	return f.meta, nil
}

func (f *fakeReads) activeLeases() (int, error) {
	f.made = append(f.made, "activeLeases")
	return f.active, f.err
}

func (f *fakeReads) leasesOf(uint32) (int, error) {
	f.made = append(f.made, "leasesOf")
	return f.uidLeases, f.err
}

func (f *fakeReads) releasedDead([]Holder) {}

func (f *fakeReads) passedPrevious(why string) { f.previous = why }

func (f *fakeReads) leasedPorts() ([]int, bool, error) {
	f.made = append(f.made, "leasedPorts")
	return f.leased, f.leasedKnown, f.err
}

func (f *fakeReads) portOwner(port int) (string, error) {
	f.made = append(f.made, "portOwner")
	return f.owners[port], f.err
}

func declared(d portdecl.Declaration) cockpitMeta {
	return cockpitMeta{Name: "app", ID: cockpitID("app"), Declared: &portdecl.Config{Declaration: d}}
}

// stepRecord is root's stack app/s at revision 3 with value v, open to every uid (mode 0777): who
// may join has tests of its own (TestJoinFollowsTheStackMode).
func stepRecord(v Value) Record {
	r := newRecord("app", "s", 0, 0, claimNow)
	open := uint32(0o777)
	r.Revision, r.Mode = 3, &open
	if v.Holders == nil {
		v.Holders = []Holder{}
	}
	r.Value = v
	return r
}

func holders(hs ...Holder) []Holder {
	out := append([]Holder{}, hs...)
	sortHolders(out)
	return out
}

func TestClaimHolderStep(t *testing.T) {
	t.Parallel()
	tracked := func(name string, pid int) Holder {
		h := newHolder(name).claimed(claimNow)
		h.PID, h.ProcessStart = pid, "proc:00000000-0000-0000-0000-000000000000:1"
		return h
	}
	alice, bob := tracked("alice", 100), newHolder("bob").claimed(claimNow)
	otherDecl := portdecl.Declaration{Step: 10, Count: 3, Bases: map[string]int{"HTTP": 30000, "DB": 31000}}
	lease0 := leaseAt(t, pureDecl, 0)
	released := &Lease{Offset: 10, Ports: leaseAt(t, pureDecl, 10).Ports, Released: true, Declaration: pureDecl}
	cases := []struct {
		name        string
		v           Value
		claimant    string
		dead        []Holder
		reads       fakeReads
		busy        []int
		wantCode    Code
		wantErr     error
		wantHolders []string
		wantOffset  int // of the lease after, -1: none
		wantReads   []string
		wantProbes  int
	}{
		{name: "first claim leases the first family", claimant: "alice", reads: fakeReads{meta: declared(pureDecl)},
			wantHolders: []string{"alice"}, wantOffset: 0, wantReads: []string{"cockpit", "activeLeases", "portOwner", "portOwner"}, wantProbes: 1},
		{name: "a family in the index is skipped", claimant: "alice", reads: fakeReads{meta: declared(pureDecl), owners: map[int]string{20000: "other/s"}},
			wantHolders: []string{"alice"}, wantOffset: 10, wantProbes: 1},
		{name: "families the cockpit leases are passed without reading their index", claimant: "alice",
			reads:       fakeReads{meta: declared(pureDecl), active: 2, leasedKnown: true, leased: []int{20000, 20010, 21000, 21010}},
			wantHolders: []string{"alice"}, wantOffset: 20, wantReads: []string{"cockpit", "activeLeases", "leasedPorts", "portOwner", "portOwner"}, wantProbes: 1},
		{name: "a store without the cockpit's leased ports reads each family's index", claimant: "alice",
			reads:       fakeReads{meta: declared(pureDecl), active: 1, owners: map[int]string{20000: "app/t"}},
			wantHolders: []string{"alice"}, wantOffset: 10, wantReads: []string{"cockpit", "activeLeases", "leasedPorts", "portOwner", "portOwner", "portOwner"}, wantProbes: 1},
		{name: "a family with a host listener is skipped", claimant: "alice", reads: fakeReads{meta: declared(pureDecl)}, busy: []int{21000},
			wantHolders: []string{"alice"}, wantOffset: 10, wantProbes: 2},
		{name: "a released lease's family is leased again", claimant: "alice", v: Value{Lease: released}, reads: fakeReads{meta: declared(pureDecl)},
			wantHolders: []string{"alice"}, wantOffset: released.Offset, wantProbes: 1},
		{name: "a co-holder keeps the lease, unprobed and unindexed", claimant: "bob", v: Value{Holders: holders(alice), Lease: lease0},
			reads: fakeReads{meta: declared(pureDecl)}, wantHolders: []string{"alice", "bob"}, wantOffset: 0, wantReads: []string{"cockpit"}},
		{name: "the same claim again changes nothing", claimant: "bob", v: Value{Holders: holders(alice, bob), Lease: lease0},
			reads: fakeReads{meta: declared(pureDecl)}, wantErr: errUnchanged},
		{name: "a dead sole holder is taken over with its lease", claimant: "bob", v: Value{Holders: holders(alice), Lease: lease0}, dead: []Holder{alice},
			reads: fakeReads{meta: declared(pureDecl)}, wantHolders: []string{"bob"}, wantOffset: 0, wantReads: []string{"cockpit"}},
		{name: "a holder observed dead that changed since is kept", claimant: "bob", v: Value{Holders: holders(alice), Lease: lease0},
			dead:  []Holder{func() Holder { h := alice; h.PID = 101; return h }()},
			reads: fakeReads{meta: declared(pureDecl)}, wantHolders: []string{"alice", "bob"}, wantOffset: 0},
		{name: "a dead co-holder is released beside the claim", claimant: "carol", v: Value{Holders: holders(alice, bob), Lease: lease0}, dead: []Holder{alice},
			reads: fakeReads{meta: declared(pureDecl)}, wantHolders: []string{"bob", "carol"}, wantOffset: 0, wantReads: []string{"cockpit"}},
		{name: "a drain is reserved", claimant: "bob", v: Value{Holders: holders(alice), Lease: lease0, Drain: &Drain{}},
			reads: fakeReads{meta: declared(pureDecl)}, wantCode: ClaimCoTenant, wantReads: []string{"cockpit"}},
		{name: "the cockpit has no declaration", claimant: "alice", reads: fakeReads{meta: cockpitMeta{Name: "app"}}, wantCode: PortFamilyOutOfRange},
		{name: "the cockpit is gone", claimant: "alice", reads: fakeReads{missing: true}, wantCode: NotFound},
		{name: "a new holder on a lease of another declaration", claimant: "bob", v: Value{Holders: holders(alice), Lease: lease0},
			reads: fakeReads{meta: declared(otherDecl)}, wantCode: ConfigChangedDuringExecution},
		{name: "a dead sole holder's takeover of a lease of another declaration", claimant: "bob", v: Value{Holders: holders(alice), Lease: lease0},
			dead: []Holder{alice}, reads: fakeReads{meta: declared(otherDecl)}, wantCode: ConfigChangedDuringExecution},
		{name: "an existing holder on a lease of another declaration", claimant: "alice", v: Value{Holders: holders(alice, bob), Lease: lease0},
			reads: fakeReads{meta: declared(otherDecl)}, wantCode: ConfigChangedDuringExecution},
		{name: "an existing holder's claim under another declaration releases no dead co-holder", claimant: "bob", v: Value{Holders: holders(alice, bob), Lease: lease0},
			dead: []Holder{alice}, reads: fakeReads{meta: declared(otherDecl)}, wantCode: ConfigChangedDuringExecution},
		{name: "the cockpit's count is reached", claimant: "alice", reads: fakeReads{meta: declared(pureDecl), active: 3}, wantCode: PortLeaseExhausted},
		{name: "every family has a listener", claimant: "alice", reads: fakeReads{meta: declared(pureDecl)}, busy: []int{20000, 20010, 20020},
			wantCode: PortFamilyCollision, wantProbes: 3},
		{name: "another checkout under the same name", claimant: "alice", v: Value{Holders: holders(newHolder("alice").claimed(claimNow))},
			reads: fakeReads{meta: declared(pureDecl)}, wantCode: StateRecordMalformed},
		{name: "the index cannot be read", claimant: "alice", reads: fakeReads{meta: declared(pureDecl), err: errors.New("disk")}, wantErr: errors.New("disk")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := stepRecord(tc.v)
			before := canonicalJSON(r)
			nh := newHolder(tc.claimant)
			if tc.name == "another checkout under the same name" {
				nh.CheckoutPath = "/elsewhere"
			}
			p := &probes{busy: map[int]bool{}}
			for _, port := range tc.busy {
				p.busy[port] = true
			}
			reads := tc.reads
			v, err := claimHolder(r, claimInput{holder: nh, dead: tc.dead}, &reads, stepEffects{probe: p.listening}, claimNow.Add(time.Minute))
			if canonicalJSON(r) != before {
				t.Fatalf("the step modified its input record")
			}
			if len(p.calls) != tc.wantProbes {
				t.Errorf("%d listener probes, want %d: %v", len(p.calls), tc.wantProbes, p.calls)
			}
			if tc.wantReads != nil && !(len(tc.wantReads) == 0 && len(reads.made) == 0) && !reflect.DeepEqual(reads.made, tc.wantReads) {
				t.Errorf("reads %v, want %v", reads.made, tc.wantReads)
			}
			switch {
			case tc.wantCode != "":
				requireCode(t, err, tc.wantCode)
				return
			case tc.wantErr != nil:
				if err == nil || err.Error() != tc.wantErr.Error() {
					t.Fatalf("got %v, want %v", err, tc.wantErr)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			if names := holderNames(v); !reflect.DeepEqual(names, tc.wantHolders) {
				t.Fatalf("holders %v, want %v", names, tc.wantHolders)
			}
			if !v.Lease.Active() || v.Lease.Offset != tc.wantOffset {
				t.Fatalf("lease %+v, want offset %d", v.Lease, tc.wantOffset)
			}
			if err := checkRecord(r.next(v, claimNow.Add(time.Minute))); err != nil {
				t.Fatalf("the step broke an invariant: %v", err)
			}
		})
	}
}

func TestSetHolderStep(t *testing.T) {
	alice := newHolder("alice").claimed(claimNow)
	alice.UID = 1000
	base := Value{Holders: holders(alice), Lease: leaseAt(t, pureDecl, 0)}
	drained := base
	drained.Drain = &Drain{}
	owner := Caller{UID: 1000}
	const s42 = "proc:00000000-0000-0000-0000-000000000000:42"
	cases := []struct {
		name     string
		v        Value
		c        Caller
		w        holderWrite
		wantCode Code
		wantErr  error
		want     func(Holder) Holder // the holder after
	}{
		{name: "a pid is recorded", v: base, c: owner, w: holderWrite{Holder: Holder{Name: "alice", PID: 42, ProcessStart: s42}, setsPID: true},
			want: func(h Holder) Holder { h.PID, h.ProcessStart = 42, s42; return h }},
		{name: "root may write", v: base, c: Caller{UID: 0}, w: holderWrite{Holder: Holder{Name: "alice", PID: 42, ProcessStart: s42}, setsPID: true},
			want: func(h Holder) Holder { h.PID, h.ProcessStart = 42, s42; return h }},
		{name: "pid=none untracks", v: Value{Holders: holders(func() Holder { h := alice; h.PID, h.ProcessStart = 7, s42; return h }()), Lease: base.Lease},
			c: owner, w: holderWrite{Holder: Holder{Name: "alice"}, setsPID: true}, want: func(h Holder) Holder { h.PID, h.ProcessStart = 0, ""; return h }},
		{name: "the creating open chooses the checkout", v: base, c: owner, w: holderWrite{Holder: Holder{Name: "alice", CheckoutPath: "/src/other"}, createdHere: true},
			want: func(h Holder) Holder { h.CheckoutPath, h.CheckoutID = "/src/other", checkoutID("/src/other"); return h }},
		{name: "a later open may not", v: base, c: owner, w: holderWrite{Holder: Holder{Name: "alice", CheckoutPath: "/src/other"}}, wantCode: StateRecordMalformed},
		{name: "the same checkout changes nothing", v: base, c: owner, w: holderWrite{Holder: Holder{Name: "alice", CheckoutPath: "/src/alice"}}, wantErr: errUnchanged},
		{name: "an empty write changes nothing", v: base, c: owner, w: holderWrite{Holder: Holder{Name: "alice"}}, wantErr: errUnchanged},
		{name: "another uid", v: base, c: Caller{UID: 1001}, w: holderWrite{Holder: Holder{Name: "alice"}, setsPID: true}, wantCode: PermissionDenied},
		{name: "an unknown holder", v: base, c: owner, w: holderWrite{Holder: Holder{Name: "bob"}, setsPID: true}, wantCode: NotFound},
		{name: "a drain is reserved", v: drained, c: owner, w: holderWrite{Holder: Holder{Name: "alice"}, setsPID: true}, wantCode: ClaimCoTenant},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := stepRecord(tc.v)
			before := canonicalJSON(r)
			v, err := setHolder(r, tc.c, tc.w)
			if canonicalJSON(r) != before {
				t.Fatalf("the step modified its input record")
			}
			switch {
			case tc.wantCode != "":
				requireCode(t, err, tc.wantCode)
				return
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got %v, want %v", err, tc.wantErr)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			was, _ := tc.v.Holder("alice")
			if got, _ := v.Holder("alice"); got != tc.want(was) {
				t.Fatalf("holder %+v, want %+v", got, tc.want(was))
			}
			if err := checkRecord(r.next(v, claimNow)); err != nil {
				t.Fatalf("the step broke an invariant: %v", err)
			}
		})
	}
}

func TestReleaseOwnStep(t *testing.T) {
	alice, bob := newHolder("alice").claimed(claimNow), newHolder("bob").claimed(claimNow)
	bob.UID = 1001
	two := Value{Holders: holders(alice, bob), Lease: leaseAt(t, pureDecl, 0)}
	cases := []struct {
		name     string
		c        Caller
		release  string
		wantCode Code
	}{
		{name: "the owner releases", c: Caller{UID: 1001}, release: "bob"},
		{name: "root releases", c: Caller{UID: 0}, release: "bob"},
		{name: "another uid", c: Caller{UID: 1000}, release: "bob", wantCode: PermissionDenied},
		{name: "an unknown holder", c: Caller{UID: 1000}, release: "carol", wantCode: NotFound},
		{name: "the last holder", c: Caller{UID: 1000}, release: "alice", wantCode: ClaimCoTenant},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := two
			if tc.name == "the last holder" {
				v.Holders = holders(alice)
			}
			r := stepRecord(v)
			before := canonicalJSON(r)
			got, err := releaseOwn(r, tc.c, tc.release, &fakeReads{})
			if canonicalJSON(r) != before {
				t.Fatalf("the step modified its input record")
			}
			if tc.wantCode != "" {
				requireCode(t, err, tc.wantCode)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if names := holderNames(got); !reflect.DeepEqual(names, []string{"alice"}) {
				t.Fatalf("holders %v, want [alice]", names)
			}
			if err := checkRecord(r.next(got, claimNow)); err != nil {
				t.Fatalf("the step broke an invariant: %v", err)
			}
		})
	}
}

func TestStackOwner(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig) // owned by the test's uid
	cockpitUID := uint32(os.Getuid())
	alice, bob := newHolder("alice").claimed(claimNow), newHolder("bob").claimed(claimNow)
	alice.UID, bob.UID = 1001, 1002
	cases := []struct {
		name string
		v    Value
		want uint32
	}{
		{"no holder: the cockpit's owner", Value{}, cockpitUID},
		{"a sole holder, who alone may reserve a drain", Value{Holders: holders(alice)}, 1001},
		{"co-holders: the cockpit's owner", Value{Holders: holders(alice, bob)}, cockpitUID},
		{"a reserved drain: its holder", Value{Holders: holders(alice, bob), Drain: &Drain{UID: 1002}}, 1002},
	}
	for _, tc := range cases {
		if got, ok := e.StackOwner(stepRecord(tc.v)); !ok || got != tc.want {
			t.Errorf("%s: %d %v, want %d", tc.name, got, ok, tc.want)
		}
	}
	gone := stepRecord(Value{})
	gone.Cockpit = "gone"
	if _, ok := e.StackOwner(gone); ok {
		t.Errorf("a stack of a missing cockpit has an owner")
	}
}

// Entrypoints are derived from the current config's declarations over the lease's ports, as the
// seeds' deriveEntrypoints does at every projection: a changed path or a new entrypoint shows on a
// running stack; one whose port the lease does not hold is left out.
func TestEnv(t *testing.T) {
	lease := leaseAt(t, pureDecl, 10)
	declared := []portdecl.Entrypoint{{Name: "web", Port: "HTTP", Path: "/app"}}
	got := stepRecord(Value{Lease: lease}).env(CockpitInfo{Entrypoints: declared})
	// The default entrypoints (db, http) are not exported: only declared ones are.
	want := []EnvVar{{"DB", "21010"}, {"HTTP", "20010"}, {"WEB_URL", "http://127.0.0.1:20010/app"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("env %v, want %v", got, want)
	}
	edited := []portdecl.Entrypoint{{Name: "web", Port: "HTTP", Path: "/v2"}, {Name: "api", Port: "DB", Path: "/"}, {Name: "gone", Port: "ADMIN", Path: "/"}}
	got = stepRecord(Value{Lease: lease}).env(CockpitInfo{Entrypoints: edited})
	want = []EnvVar{{"DB", "21010"}, {"HTTP", "20010"}, {"API_URL", "http://127.0.0.1:21010/"}, {"WEB_URL", "http://127.0.0.1:20010/v2"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("env after the edit %v, want %v", got, want)
	}
	released := *lease
	released.Released = true
	if env := stepRecord(Value{Lease: &released}).env(CockpitInfo{Entrypoints: declared}); env != nil {
		t.Fatalf("a released lease has env %v", env)
	}
}
