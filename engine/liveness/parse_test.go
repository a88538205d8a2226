package liveness

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// statLine builds a /proc/<pid>/stat line shaped like the kernel's, with 52 fields.
func statLine(comm, session, ticks string) string {
	after := make([]string, 50) // fields 3..52
	for i := range after {
		after[i] = "0"
	}
	after[0] = "S"
	after[1] = "1"
	after[3] = session
	after[19] = ticks
	return "4242 (" + comm + ") " + strings.Join(after, " ") + "\n"
}

func TestParseStatRealSelf(t *testing.T) {
	text, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	fields, ok := parseStat(string(text))
	if !ok {
		t.Fatalf("parseStat(%q) refused the kernel's own line", text)
	}
	sid, err := unix.Getsid(0)
	if err != nil {
		t.Fatal(err)
	}
	if fields.session != sid {
		t.Errorf("session = %d, want getsid(0) = %d", fields.session, sid)
	}
	if fields.ppid != os.Getppid() {
		t.Errorf("ppid = %d, want getppid() = %d", fields.ppid, os.Getppid())
	}
	if !digits(fields.startTicks, 20) || fields.startTicks == "0" {
		t.Errorf("start ticks = %q, want a positive decimal", fields.startTicks)
	}
}

func TestParseStat(t *testing.T) {
	valid := []struct {
		name, comm string
	}{
		{"plain", "sleep"},
		{"spaces", "my prog name"},
		{"close paren inside", "a) S 1 2 3"},
		{"both parens", "(x) (y)"},
		{"newline", "two\nlines"},
		{"empty", ""},
		{"only parens", ")))((("},
	}
	for _, c := range valid {
		t.Run(c.name, func(t *testing.T) {
			fields, ok := parseStat(statLine(c.comm, "777", "123456789"))
			if !ok || fields.ppid != 1 || fields.session != 777 || fields.startTicks != "123456789" {
				t.Fatalf("parseStat with comm %q = %+v, %v; want ppid 1, session 777, ticks 123456789", c.comm, fields, ok)
			}
		})
	}
	if fields, ok := parseStat(statLine("x", "0", strings.Repeat("9", 20))); !ok || fields.startTicks != strings.Repeat("9", 20) {
		t.Errorf("20-digit ticks refused: %+v, %v", fields, ok)
	}

	full := statLine("x", "777", "123")
	invalid := map[string]string{
		"empty":                                "",
		"no close paren":                       strings.Replace(full, ")", "", 1),
		"no space after paren":                 strings.Replace(full, ") ", ")", 1),
		"truncated at 21":                      full[:strings.Index(full, ") ")+2] + strings.Join(strings.Fields(full[strings.Index(full, ") ")+2:])[:19], " "),
		"only pid and comm":                    "4242 (x)",
		"non-numeric ticks":                    statLine("x", "777", "12a"),
		"negative ticks":                       statLine("x", "777", "-5"),
		"empty ticks":                          statLine("x", "777", ""),
		"21-digit ticks":                       statLine("x", "777", strings.Repeat("1", 21)),
		"non-numeric session":                  statLine("x", "abc", "123"),
		"negative session":                     statLine("x", "-1", "123"),
		"huge session":                         statLine("x", "99999999999", "123"),
		"non-numeric ppid":                     strings.Replace(statLine("x", "777", "123"), ") S 1 ", ") S x ", 1),
		"huge ppid":                            strings.Replace(statLine("x", "777", "123"), ") S 1 ", ") S 99999999999 ", 1),
		"fake fields in comm, real ones short": "1 (a) S 0 0 777 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 123) S",
	}
	for name, text := range invalid {
		if fields, ok := parseStat(text); ok {
			t.Errorf("%s: parseStat(%q) = %+v, want refusal", name, text, fields)
		}
	}
}

func TestParseBootID(t *testing.T) {
	real, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := parseBootID(string(real)); !ok || id != strings.TrimSpace(string(real)) {
		t.Errorf("parseBootID(%q) = %q, %v", real, id, ok)
	}
	const good = "6ecf8df8-5308-48f4-a516-1ffda9da1137"
	if id, ok := parseBootID(good + "\n"); !ok || id != good {
		t.Errorf("parseBootID(good) = %q, %v", id, ok)
	}
	for _, bad := range []string{
		"",
		"\n",
		good[:35],
		good + "0",
		strings.ToUpper(good),
		good + " garbage",
		good + "\nsecond line",
		strings.ReplaceAll(good, "-", ""),
		"6ecf8df8_5308_48f4_a516_1ffda9da1137",
		"gecf8df8-5308-48f4-a516-1ffda9da1137",
	} {
		if id, ok := parseBootID(bad); ok {
			t.Errorf("parseBootID(%q) = %q, want refusal", bad, id)
		}
	}
}

func TestParseLstart(t *testing.T) {
	valid := map[string]string{
		"Sun Nov 29 19:00:00 2026\n":  "lstart:2026-11-29T19:00:00.000Z",
		"Mon Nov  2 03:04:05 2026":    "lstart:2026-11-02T03:04:05.000Z",
		"Thu Jan 01 00:00:00 1970":    "lstart:1970-01-01T00:00:00.000Z",
		"Sat Feb 29 23:59:59 2028":    "lstart:2028-02-29T23:59:59.000Z",
		"  Tue Dec 31 12:00:00 2030 ": "lstart:2030-12-31T12:00:00.000Z",
	}
	for text, want := range valid {
		got, ok := parseLstart(text)
		if !ok || got != want {
			t.Errorf("parseLstart(%q) = %q, %v; want %q", text, got, ok, want)
		}
		if !IsStart(got) {
			t.Errorf("IsStart(%q) = false for parseLstart's own output", got)
		}
	}
	for _, bad := range []string{
		"",
		"garbage",
		"Sun Foo 29 19:00:00 2026",
		"Sun nov 29 19:00:00 2026",
		"Xyz Nov 29 19:00:00 2026",
		"Sun Nov 29 19:00 2026",
		"Sun Nov 29 19:00:00 26",
		"Sun Nov 123 19:00:00 2026",
		"Sun Feb 30 19:00:00 2026",
		"Sun Feb 29 19:00:00 2027",
		"Sun Nov 0 19:00:00 2026",
		"Sun Nov 29 24:00:00 2026",
		"Sun Nov 29 19:60:00 2026",
		"Sun Nov 29 19:00:00 2026 extra",
		"Sun Nov 29 19:00:00 2026\nSun Nov 29 19:00:00 2026",
		"Son Nov 29 19:00:00 2026",
	} {
		if got, ok := parseLstart(bad); ok {
			t.Errorf("parseLstart(%q) = %q, want refusal", bad, got)
		}
	}
}

func TestParseTgid(t *testing.T) {
	real, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if pid, ok := parseTgid(string(real)); !ok || pid != os.Getpid() {
		t.Errorf("parseTgid(/proc/self/status) = %d, %v; want %d", pid, ok, os.Getpid())
	}
	if pid, ok := parseTgid("Name:\tx\nUmask:\t0022\nState:\tS\nTgid:\t99\nNgid:\t0\nPid:\t100\n"); !ok || pid != 99 {
		t.Errorf("parseTgid(sample) = %d, %v; want 99", pid, ok)
	}
	for _, bad := range []string{
		"",
		"Name:\tx\nPid:\t100\n",
		"Tgid:\t\n",
		"Tgid:\tabc\n",
		"Tgid:\t0\n",
		"Tgid:\t-4\n",
		"Tgid:\t99999999999\n",
		"Name:\tTgid:\t5\n",
	} {
		if pid, ok := parseTgid(bad); ok {
			t.Errorf("parseTgid(%q) = %d, want refusal", bad, pid)
		}
	}
}

func TestIsStart(t *testing.T) {
	const boot = "6ecf8df8-5308-48f4-a516-1ffda9da1137"
	valid := []string{
		"proc:" + boot + ":0",
		"proc:" + boot + ":" + strings.Repeat("9", 20),
		"lstart:2026-11-29T19:00:00.000Z",
		"lstart:2028-02-29T00:00:00.123Z",
	}
	for _, s := range valid {
		if !IsStart(s) {
			t.Errorf("IsStart(%q) = false, want true", s)
		}
	}
	invalid := []string{
		"",
		"proc:",
		"proc:" + boot,
		"proc:" + boot + ":",
		"proc:" + boot + ":" + strings.Repeat("9", 21),
		"proc:" + boot + ":12a",
		"proc:" + strings.ToUpper(boot) + ":1",
		"proc:" + boot + ":1\n",
		"PROC:" + boot + ":1",
		"lstart:",
		"lstart:2026-11-29T19:00:00Z",
		"lstart:2026-11-29 19:00:00.000Z",
		"lstart:2026-02-30T19:00:00.000Z",
		"lstart:2026-11-29T24:00:00.000Z",
		"lstart:2026-11-29T19:00:00.000+01:00",
		"lstart:2026-11-29T19:00:00.000Z\n",
		"pid:" + boot + ":1",
		"2026-11-29T19:00:00.000Z",
	}
	for _, s := range invalid {
		if IsStart(s) {
			t.Errorf("IsStart(%q) = true, want false", s)
		}
	}
}

// The hand-written checks accept exactly what the patterns they replaced accept, on identities
// and on every one-byte change, deletion and insertion of them.
func TestProcStartAgreesWithItsPattern(t *testing.T) {
	pattern := regexp.MustCompile(`^proc:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}:[0-9]{1,20}$`)
	const boot = "6ecf8df8-5308-48f4-a516-1ffda9da1137"
	seeds := []string{"proc:" + boot + ":0", "proc:" + boot + ":" + strings.Repeat("9", 20), "proc:" + boot + ":123"}
	alphabet := []byte("09afgAF:-\n pro")
	r := rand.New(rand.NewPCG(1, 2))
	checked := 0
	check := func(s string) {
		checked++
		boot, ok := BootOf(s)
		if want := pattern.MatchString(s); ok != want {
			t.Errorf("BootOf(%q) ok = %v, the pattern says %v", s, ok, want)
		}
		if ok && "proc:"+boot != s[:len("proc:")+len(boot)] {
			t.Errorf("BootOf(%q) = %q", s, boot)
		}
	}
	for _, seed := range seeds {
		check(seed)
		for i := 0; i <= len(seed); i++ {
			if i < len(seed) {
				check(seed[:i] + seed[i+1:])
				for range 3 {
					check(seed[:i] + string(alphabet[r.IntN(len(alphabet))]) + seed[i+1:])
				}
			}
			check(seed[:i] + string(alphabet[r.IntN(len(alphabet))]) + seed[i:])
		}
	}
	if checked < 500 {
		t.Fatalf("only %d strings checked", checked)
	}
	if id, ok := parseBootID(boot + "\n"); !ok || id != boot || isBootID(strings.ToUpper(boot)) || isBootID(boot[:35]+"g") {
		t.Errorf("isBootID disagrees with the boot ID's shape")
	}
}

func TestGoneDecisionTable(t *testing.T) {
	const (
		procA   = "proc:6ecf8df8-5308-48f4-a516-1ffda9da1137:100"
		procB   = "proc:6ecf8df8-5308-48f4-a516-1ffda9da1137:200"
		lstartA = "lstart:2026-11-29T19:00:00.000Z"
	)
	cases := []struct {
		recorded string
		obs      Observation
		gone     bool
	}{
		{"", Observation{State: Absent}, true},
		{procA, Observation{State: Absent}, true},
		{lstartA, Observation{State: Absent}, true},

		{"", Observation{State: Present, Start: procA}, false},      // nothing recorded to compare
		{procA, Observation{State: Present, Start: procA}, false},   // same process
		{procA, Observation{State: Present, Start: procB}, true},    // pid reused
		{procA, Observation{State: Present, Start: lstartA}, false}, // read another way: cannot decide
		{lstartA, Observation{State: Present, Start: procA}, false}, // read another way: cannot decide
		{lstartA, Observation{State: Present, Start: "lstart:2026-11-29T19:00:01.000Z"}, true},
		{"garbage", Observation{State: Present, Start: procB}, false}, // no kind at all
		{":x", Observation{State: Present, Start: ":y"}, false},       // empty kind

		{"", Observation{State: Unknown, Reason: "x"}, false},
		{procA, Observation{State: Unknown, Reason: "x"}, false},
		{procA, Observation{State: Unknown, Start: procB}, false},
		{lstartA, Observation{State: Unknown}, false},
		{procA, Observation{State: State(42), Start: procB}, false},
	}
	for _, c := range cases {
		if got := Gone(c.recorded, c.obs); got != c.gone {
			t.Errorf("Gone(%q, %+v) = %v, want %v", c.recorded, c.obs, got, c.gone)
		}
	}
}

func TestClassifySignal(t *testing.T) {
	cases := []struct {
		err  error
		want probe
	}{
		{nil, probeLive},
		{unix.EPERM, probeLive}, // another user's process exists
		{unix.ESRCH, probeGone},
		{fmt.Errorf("wrapped: %w", unix.ESRCH), probeGone},
		{unix.EINVAL, probeUnsure},
		{unix.EINTR, probeUnsure},
		{errors.New("something else"), probeUnsure},
	}
	for _, c := range cases {
		if got := classifySignal(c.err); got != c.want {
			t.Errorf("classifySignal(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestDigits(t *testing.T) {
	for s, want := range map[string]bool{"0": true, "1234567890": true, "12345678901": false, "": false, "-1": false, "1a": false, " 1": false, "1\n": false} {
		if got := digits(s, 10); got != want {
			t.Errorf("digits(%q, 10) = %v, want %v", s, got, want)
		}
	}
}

// KilledBy reads the same line as parseStat: after the last ')', whatever the name holds, the
// flags and the exit code, the last field, whose newline is no part of it.
func TestParseKilledBy(t *testing.T) {
	line := func(comm, flags, code string) string {
		text := statLine(comm, "777", "123")
		fields := strings.Split(strings.TrimSuffix(text[strings.LastIndexByte(text, ')')+2:], "\n"), " ")
		fields[6], fields[49] = flags, code
		return text[:strings.LastIndexByte(text, ')')+2] + strings.Join(fields, " ") + "\n"
	}
	for _, comm := range []string{"sleep", "a) S 1 2 3", "two\nlines"} {
		if sig, ok := parseKilledBy(line(comm, "4194372", "9")); !ok || sig != unix.SIGKILL {
			t.Errorf("comm %q, exiting with code 9: %v, %v; want SIGKILL", comm, sig, ok)
		}
	}
	refused := map[string]string{
		"not exiting":          line("x", "4194368", "9"),
		"exited, not signaled": line("x", "4194372", "256"),
		"exit code unreadable": line("x", "4194372", "0"),
		"short line":           "1 (x) S 1 1 1 0 -1 4194372",
		"no name":              "1 x S",
	}
	for name, text := range refused {
		if sig, ok := parseKilledBy(text); ok {
			t.Errorf("%s: parseKilledBy(%q) = %v, want no signal", name, text, sig)
		}
	}
}

func TestGroupsOfSelf(t *testing.T) {
	groups, err := Groups(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(groups) != fmt.Sprint(want) && !(len(groups) == 0 && len(want) == 0) {
		t.Errorf("Groups(self) = %v, want getgroups() = %v", groups, want)
	}
	if got := parseGroups("Name:\tx\nGroups:\t4 24 x 27\nNgid:\t0\n"); fmt.Sprint(got) != "[4 24 27]" {
		t.Errorf("parseGroups = %v, want [4 24 27]", got)
	}
}

func TestParseFdinfoFlags(t *testing.T) {
	for text, want := range map[string]int{
		"pos:\t0\nflags:\t0100001\nmnt_id:\t42\nino:\t7\n": 0o100001,
		"pos:\t12\nflags:\t02\nmnt_id:\t42\n":              0o2,
		"flags:\t0100000\n":                                0o100000,
	} {
		if got, ok := parseFdinfoFlags(text); !ok || got != want {
			t.Errorf("parseFdinfoFlags(%q) = %#o, %v; want %#o", text, got, ok, want)
		}
	}
	for _, text := range []string{"", "pos:\t0\n", "flags:\t09\n", "flags:\n"} {
		if got, ok := parseFdinfoFlags(text); ok {
			t.Errorf("parseFdinfoFlags(%q) = %#o, want no flags", text, got)
		}
	}
}
