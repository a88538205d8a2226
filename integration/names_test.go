package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Names (SPEC §2): hostile names are refused with the errno that says why, names the tree does
// not define are refused with EPERM, and nothing is created either way. Port bases: 37xxx.

// namesHostile are names no cockpit, stack or holder may have (each refused with EINVAL).
var namesHostile = map[string]string{
	"leading dot":  ".hidden",
	"leading dash": "-x",
	"129 bytes":    strings.Repeat("a", 129),
	"255 bytes":    strings.Repeat("b", 255),
	"space":        "a b",
	"non-UTF-8":    "\xff\xfe",
	"colon":        "a:b",
	"unicode":      "café",
	"dot":          ".",
}

// namesQuote quotes s for bash ($'...' keeps any byte).
func namesQuote(s string) string {
	var b strings.Builder
	b.WriteString("$'")
	for _, c := range []byte(s) {
		if c >= 0x80 || c == '\'' || c == '\\' {
			fmt.Fprintf(&b, "\\x%02x", c)
			continue
		}
		b.WriteByte(c)
	}
	b.WriteString("'")
	return b.String()
}

func namesSetup(t *testing.T, base int) *mount {
	t.Helper()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": base}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	return m
}

// namesState is everything a refused name could have changed.
func namesState(m *mount) string {
	m.t.Helper()
	return m.ok(`cd $M && ls -a . app app/stacks app/stacks/s app/stacks/s/holders app/stacks/s/drain && cat app/config app/stacks/s/record app/stacks/s/holders/me`)
}

func TestNamesHostileCockpits(t *testing.T) {
	t.Parallel()
	m := namesSetup(t, 37000)
	before := namesState(m)
	for what, name := range namesHostile {
		if name == "." {
			continue // mkdir . is the kernel's EEXIST
		}
		t.Run(what, func(t *testing.T) {
			m.refused("mkdir -- $M/"+namesQuote(name), syscall.EINVAL)
		})
	}
	// Reserved names exist already as the tree's own entries.
	for _, name := range []string{"README", "ports", "status", "status.json", "gc"} {
		m.refused("mkdir $M/"+name, syscall.EEXIST)
	}
	if after := namesState(m); after != before {
		t.Fatalf("refused names changed the tree:\n%s\n->\n%s", before, after)
	}
}

func TestNamesHostileStacksAndHolders(t *testing.T) {
	t.Parallel()
	m := namesSetup(t, 37100)
	before := namesState(m)
	for what, name := range namesHostile {
		t.Run(what, func(t *testing.T) {
			if name != "." {
				m.refused("mkdir -- $M/app/stacks/"+namesQuote(name), syscall.EINVAL)
				claimsRefusalEvent(t, m, "app/events", "STATE_RECORD_MALFORMED", "EINVAL")
			}
			if name == "." {
				return // holders/. is the directory itself
			}
			m.refused("touch -- $M/app/stacks/s/holders/"+namesQuote(name), syscall.EINVAL)
			claimsRefusalEvent(t, m, "app/stacks/s/events", "STATE_RECORD_MALFORMED", "EINVAL")
		})
	}
	if after := namesState(m); after != before {
		t.Fatalf("refused names changed the tree:\n%s\n->\n%s", before, after)
	}
	// 128 bytes is the longest valid name.
	long := strings.Repeat("c", 128)
	m.ok("mkdir $M/app/stacks/" + long + " && touch $M/app/stacks/s/holders/" + long)
}

// Names the tree does not define: EPERM, recorded in the nearest events file, nothing created.
func TestNamesUndefined(t *testing.T) {
	t.Parallel()
	m := namesSetup(t, 37200)
	before := namesState(m)
	for _, tc := range []struct{ script, events string }{
		{"mkdir $M/app/foo", "app/events"},
		{"touch $M/app/stacks/s/foo", "app/stacks/s/events"},
		{"mkdir $M/app/stacks/s/holders/x", "app/stacks/s/events"},
		{"touch $M/app/stacks/s/drain/foo", "app/stacks/s/events"},
		{"ln -s /tmp $M/app/stacks/s/holders/link", "app/stacks/s/events"},
		{"ln $M/app/stacks/s/holders/me $M/app/stacks/s/holders/me2", "app/stacks/s/events"},
		{"mkfifo $M/app/stacks/s/holders/fifo", "app/stacks/s/events"},
		{"rm $M/app/stacks/s/record", "app/stacks/s/events"},
		{"rm $M/app/stacks/s/drain/attempt", "app/stacks/s/events"},
		{"rmdir $M/app/stacks/s/holders", "app/stacks/s/events"},
		{"rm $M/README", ""},
		{"touch $M/foo", ""},
	} {
		t.Run(tc.script, func(t *testing.T) {
			m.refused(tc.script, syscall.EPERM)
			if tc.events != "" {
				claimsRefusalEvent(t, m, tc.events, "UNDEFINED_NAME", "EPERM")
			}
		})
	}
	if after := namesState(m); after != before {
		t.Fatalf("refused names changed the tree:\n%s\n->\n%s", before, after)
	}
}

// Read-only files refuse writes, and keep their content.
func TestNamesReadOnlyFiles(t *testing.T) {
	t.Parallel()
	m := namesSetup(t, 37300)
	before := namesState(m) + m.read("README") + m.read("ports/37300") + m.read("app/stacks/s/lease")
	for _, script := range []string{
		"echo x > $M/app/stacks/s/record",
		"echo x >> $M/app/stacks/s/lease",
		"echo x > $M/app/stacks/s/revision",
		"echo x > $M/app/stacks/s/env",
		"echo x > $M/app/stacks/s/ports/HTTP",
		"echo x > $M/app/events",
		"echo x > $M/README",
		"echo x > $M/ports/37300",
		"truncate -s 0 $M/app/stacks/s/record",
		"touch $M/app/stacks/s/record",
	} {
		t.Run(script, func(t *testing.T) {
			if r := m.sh(script); r.Code == 0 {
				t.Fatalf("%s succeeded", script)
			} else if !strings.Contains(r.Stderr, "Permission denied") && !strings.Contains(r.Stderr, "Operation not permitted") {
				t.Errorf("%s: %s", script, r.Stderr)
			}
		})
	}
	if after := namesState(m) + m.read("README") + m.read("ports/37300") + m.read("app/stacks/s/lease"); after != before {
		t.Fatalf("writes to read-only files changed them:\n%s\n->\n%s", before, after)
	}
}

// A command over 64 KiB in one write(2): EFBIG, recorded, nothing changed; 64 KiB exactly is
// parsed (and refused as malformed).
func TestNamesCommandTooLarge(t *testing.T) {
	t.Parallel()
	m := namesSetup(t, 37400)
	before := namesState(m)
	write := func(n string) string {
		return "head -c " + n + " /dev/zero | tr '\\0' a | dd status=none bs=70000 iflag=fullblock of=$M/app/stacks/s/holders/me"
	}
	m.refused(write("65537"), syscall.EFBIG)
	claimsRefusalEvent(t, m, "app/stacks/s/events", "COMMAND_TOO_LARGE", "EFBIG")
	m.refused(write("65536"), syscall.EINVAL)
	claimsRefusalEvent(t, m, "app/stacks/s/events", "STATE_RECORD_MALFORMED", "EINVAL")
	if after := namesState(m); after != before {
		t.Fatalf("refused writes changed the tree:\n%s\n->\n%s", before, after)
	}
	// A config document over 64 KiB is refused the same way.
	m.refused(`{ head -c 65537 /dev/zero | tr '\0' '#'; } | dd status=none bs=70000 iflag=fullblock of=$M/app/config`, syscall.EFBIG)
	claimsRefusalEvent(t, m, "app/events", "COMMAND_TOO_LARGE", "EFBIG")
	if after := namesState(m); after != before {
		t.Fatalf("a refused config changed the tree")
	}
}

// At most 1024 holders a stack: the 1025th claim is refused with ENOSPC, CLAIM_HOLDER_LIMIT (a
// holder limit, not a port code). Each claim rewrites a record that grows with its holders:
// ≈20 s without -race, ≈3 min with it, so it runs in the long runs (scripts/long); engine's claim
// tables test the limit in every run.
func TestNamesHolderLimit(t *testing.T) {
	if os.Getenv("COCKPITFS_LONG") == "" {
		t.Skip("a long run: scripts/long runs it")
	}
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 37500}, "s")
	start := time.Now()
	// Untracked holders (created and set pid=none on one open, by the shell itself): no liveness
	// probe per claim, no process spawn per holder.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", `cd "$M/app/stacks/s/holders" && for i in {0001..1024}; do
		echo pid=none > h$i || { echo "holder h$i refused; last events:"; tail -n 3 ../events; exit 1; }
	done`)
	cmd.Env = append(os.Environ(), "M="+m.Dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("creating 1024 holders: %v\n%s", err, out)
	}
	t.Logf("1024 claims took %v", time.Since(start))
	// Counted from the record: ls of 1024 holders takes > 60 s under -race (every entry's lookup
	// decodes the whole record again; see the report).
	if got := len(claimsRecord(t, m, "s")["value"].(map[string]any)["holders"].([]any)); got != 1024 {
		t.Fatalf("holders = %d", got)
	}
	before := m.read("app/stacks/s/revision")
	m.refused("touch $M/app/stacks/s/holders/h1025", syscall.ENOSPC)
	claimsRefusalEvent(t, m, "app/stacks/s/events", "CLAIM_HOLDER_LIMIT", "ENOSPC")
	if got := m.read("app/stacks/s/revision"); got != before || before != "2048\n" {
		t.Fatalf("revision %q -> %q, want 2048 (a claim and a write per holder)", before, got)
	}
	if r := m.sh("stat $M/app/stacks/s/holders/h1025"); r.Code == 0 {
		t.Fatal("the refused holder exists")
	}
	// Touching an existing holder is no new claim: still fine at the limit.
	m.ok("touch $M/app/stacks/s/holders/h0001")
}
