package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Entrypoint kinds and declared values, as the seeds' deriveEntrypoints has them: config takes a
// kind per entrypoint, entrypoints.json is the derivation (each value with its kind and port key,
// defaults of kind "entrypoint"), and a value recorded in declared-values that differs from the
// derived URL is reported: a loopback one as corrected, any other as a registration to update.
// entrypoints/<name> stays the URL alone.
func TestFidelityEntrypointKindsAndDeclaredValues(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app $M/app/stacks/s")
	config := "[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 34080\nDB = 34432\n" +
		"[entrypoints.web]\nport = \"HTTP\"\npath = \"/app\"\n" +
		"[entrypoints.callback]\nport = \"HTTP\"\npath = \"/oauth/callback\"\nkind = \"oauth-callback\"\n"
	claimsConfig(m, "app", config)
	m.ok("touch $M/app/stacks/s/holders/me")

	derived := `{"kind":"complete","values":[` +
		`{"name":"http","kind":"entrypoint","port":"HTTP","value":"http://127.0.0.1:34080/"},` +
		`{"name":"db","kind":"entrypoint","port":"DB","value":"http://127.0.0.1:34432/"},` +
		`{"name":"callback","kind":"oauth-callback","port":"HTTP","value":"http://127.0.0.1:34080/oauth/callback"},` +
		`{"name":"web","kind":"entrypoint","port":"HTTP","value":"http://127.0.0.1:34080/app"}],`
	if got, want := m.read("app/stacks/s/entrypoints.json"), derived+`"diagnostics":[]}`+"\n"; got != want {
		t.Fatalf("entrypoints.json =\n%s\nwant\n%s", got, want)
	}
	if got := m.read("app/stacks/s/entrypoints/callback"); got != "http://127.0.0.1:34080/oauth/callback\n" {
		t.Fatalf("entrypoints/callback = %q: still the URL alone", got)
	}

	// Values recorded elsewhere: web's .env line from another family, callback's registration
	// at a provider. Matching values say nothing. The cockpit's wait, opened before, wakes
	// naming the stack's events, where the write is recorded.
	cockpitWait := startReader(t, m, "exec 3<$M/app/wait && echo opened && exec cat <&3")
	for deadline := time.Now().Add(20 * time.Second); cockpitWait.output() != "opened\n"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) || cockpitWait.done() {
			t.Fatalf("the cockpit's wait did not open: %q", cockpitWait.output())
		}
	}
	m.ok(`cat > $M/app/stacks/s/declared-values <<'EOF'
# from .env and the provider's console
web=http://localhost:34090/app
callback=https://auth.example.com/oauth/callback
EOF`)
	if got := cockpitWait.wait(t); got != "opened\nstacks/s/events\n" {
		t.Fatalf("the cockpit's wait printed %q after a declared-values write", got)
	}
	if ev := m.lastEvent("app/stacks/s/events"); !strings.Contains(ev, `"result":"ok"`) || !strings.Contains(ev, `"path":"app/stacks/s/declared-values"`) {
		t.Fatalf("the declared-values write's events line: %s", ev)
	}
	want := derived + `"diagnostics":[` +
		`{"severity":"info","code":"PORT_EXTERNAL_REGISTRATION_GAP","message":"external registration cannot be updated by cockpit","target":"callback","fix":"update the external registration to http://127.0.0.1:34080/oauth/callback"},` +
		`{"severity":"warning","code":"PORT_LOCAL_VALUE_CORRECTED","message":"stale loopback value was replaced from the accepted lease","target":"web","fix":"use http://127.0.0.1:34080/app"}]}` + "\n"
	if got := m.read("app/stacks/s/entrypoints.json"); got != want {
		t.Fatalf("entrypoints.json with declared values =\n%s\nwant\n%s", got, want)
	}
	m.ok("printf 'web=http://127.0.0.1:34080/app\\n' > $M/app/stacks/s/declared-values")
	if got := m.read("app/stacks/s/entrypoints.json"); got != derived+`"diagnostics":[]}`+"\n" {
		t.Fatalf("entrypoints.json with a current declared value =\n%s", got)
	}

	// A malformed document is refused whole, and the one accepted stays.
	before := m.read("app/stacks/s/declared-values")
	m.refused("/bin/echo 'web http://x' > $M/app/stacks/s/declared-values", syscall.EINVAL)
	claimsRefusalEvent(t, m, "app/stacks/s/events", "STATE_RECORD_MALFORMED", "EINVAL")
	if got := m.read("app/stacks/s/declared-values"); got != before {
		t.Fatalf("declared-values after a refused write = %q, want %q", got, before)
	}

	// A kind that is not one is refused with the config unchanged.
	m.refused("cat > $M/app/config <<'EOF'\n[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 34080\n[entrypoints.x]\nport = \"HTTP\"\npath = \"/\"\nkind = \"Web App\"\nEOF", syscall.EINVAL)
	claimsRefusalEvent(t, m, "app/events", "PORT_FAMILY_OUT_OF_RANGE", "EINVAL")
	if got := m.read("app/config"); got != config {
		t.Fatalf("config after a refused kind = %q", got)
	}

	// The config's bases change under the running stack: an entrypoint on a key the lease does
	// not hold refuses the derivation, as the seeds' does; env leaves it out.
	claimsConfig(m, "app", "[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 34080\nAPI = 34500\n"+
		"[entrypoints.svc]\nport = \"API\"\npath = \"/\"\n")
	refusal := `{"kind":"refusal","diagnostics":[{"severity":"error","code":"PORT_FAMILY_OUT_OF_RANGE","message":"entrypoint references a port absent from the accepted lease","target":"API",`
	if got := m.read("app/stacks/s/entrypoints.json"); !strings.HasPrefix(got, refusal) {
		t.Fatalf("entrypoints.json after the bases changed =\n%s\nwant it to start\n%s", got, refusal)
	}
	if got := m.read("app/stacks/s/env"); strings.Contains(got, "API") {
		t.Fatalf("env names an entrypoint the lease cannot serve:\n%s", got)
	}
}

// An active reclaim is bound to the record it was planned from, as the seeds' reclaimDrainStep
// binds it: drain/planning serves that record (exactly what record showed before the attempt
// started: the drain's last progress for a first try, the published failure for a retry), and an
// outcome naming another record with planned= is refused as invalid evidence, changing nothing;
// the same outcome written again once published succeeds and changes nothing.
func TestFidelityReclaimPlanningRecord(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(2, map[string]int{"HTTP": 34600}, "s")
	s := "$M/app/stacks/s"
	m.ok("cd " + s + " && touch holders/me && echo 'down volume:a volume:b' > drain/request && echo start > drain/attempt")
	if got := m.read("app/stacks/s/drain/planning"); got != "" {
		t.Fatalf("drain/planning during runtime-stop = %q, want empty: only a reclaim has one", got)
	}
	drainRefused(t, m, "s", "echo success planned=1 > "+s+"/drain/outcome", syscall.ESTALE, "LIFECYCLE_EVIDENCE_INVALID")
	m.ok("echo success > " + s + "/drain/outcome")

	for try, outcome := range []string{"failure", "success"} {
		planned := m.read("app/stacks/s/record")
		revision := drainRevision(t, m, "s")
		m.ok("echo start > " + s + "/drain/attempt")
		if got := m.read("app/stacks/s/drain/planning"); got != planned {
			t.Fatalf("try %d: drain/planning =\n%s\nwant the record before the start:\n%s", try, got, planned)
		}
		for _, other := range []int{revision - 1, revision + 1, revision + 2} {
			ev := drainRefused(t, m, "s", fmt.Sprintf("echo %s planned=%d > %s/drain/outcome", outcome, other, s), syscall.ESTALE, "LIFECYCLE_EVIDENCE_INVALID")
			if fix := fmt.Sprint(ev["fix"]); !strings.Contains(fix, fmt.Sprintf("planned=%d", revision)) {
				t.Fatalf("fix %q does not name planned=%d", fix, revision)
			}
		}
		publish := fmt.Sprintf("echo %s planned=%d > %s/drain/outcome", outcome, revision, s)
		m.ok(publish)
		if got := m.read("app/stacks/s/drain/planning"); got != "" {
			t.Fatalf("try %d: drain/planning after the outcome = %q, want empty", try, got)
		}
		// An executor that lost the answer writes its outcome again: the record is that
		// outcome's publication (the seeds' matchReclaimDrainContinuation), so it succeeds and
		// changes nothing. Another planning revision does not match, and is refused.
		published := drainState(m, "s")
		m.ok(publish)
		if got := drainState(m, "s"); got != published {
			t.Fatalf("try %d: the repeated outcome changed the stack:\n%s\n->\n%s", try, published, got)
		}
		drainRefused(t, m, "s", fmt.Sprintf("echo %s planned=%d > %s/drain/outcome", outcome, revision+1, s), syscall.ESTALE, "EXECUTION_PRECONDITION_CHANGED")
	}
	// The next reclaim plans from the progress the success published.
	planned := m.read("app/stacks/s/record")
	m.ok("echo start > " + s + "/drain/attempt")
	if got := m.read("app/stacks/s/drain/planning"); got != planned {
		t.Fatalf("the second reclaim's drain/planning =\n%s\nwant\n%s", got, planned)
	}
	var att map[string]any
	if err := json.Unmarshal([]byte(m.read("app/stacks/s/drain/attempt")), &att); err != nil || att["currentTarget"] != "volume:b" {
		t.Fatalf("drain/attempt = %v (%v), want the reclaim of volume:b", att, err)
	}
	// The store with a reclaim active, planning and all, meets every invariant offline.
	m.Stop()
	if out, err := m.verify(); err != nil {
		t.Fatalf("cockpitfs verify with a reclaim active: %v\n%s", err, out)
	}
}

// declared-values is written by the cockpit's owner or a holder of the stack: another uid is
// refused (EACCES) at open, with its events line and nothing changed, until it holds the stack.
func TestFidelityDeclaredValuesOwnership(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	m.setupApp(2, map[string]int{"HTTP": 34700}, "s")
	m.ok("touch $M/app/stacks/s/holders/root && echo web=http://localhost:1/ > $M/app/stacks/s/declared-values")
	before := m.read("app/stacks/s/declared-values")
	ownershipNobodyRefused(m, "echo web=http://localhost:2/ > $M/app/stacks/s/declared-values", syscall.EACCES)
	ownershipDenied(m, "app/stacks/s/events")
	if got := m.read("app/stacks/s/declared-values"); got != before {
		t.Fatalf("declared-values after nobody's refused write = %q, want %q", got, before)
	}
	m.ok("chmod o+w $M/app/stacks/s") // root's stack, open to nobody's claim
	ownershipNobodyOK(m, "touch $M/app/stacks/s/holders/nob && echo web=http://localhost:2/ > $M/app/stacks/s/declared-values")
	if got := m.read("app/stacks/s/declared-values"); got != "web=http://localhost:2/\n" {
		t.Fatalf("declared-values written by a holder = %q", got)
	}
}
