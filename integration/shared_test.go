package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// A shared machine, attacked by a co-user (nobody) who owns a cockpit another user (root, the
// victim) runs stacks of: docs/env.md, docs/machines.md.

// sharedSafeConfig declares an entrypoint whose path holds every byte a path may (docs/env.md).
const sharedSafeConfig = `[ports]
step = 10
count = 4
[ports.bases]
HTTP = 33950
[entrypoints.web]
port = "HTTP"
path = "/a-b.c_d~e/f:g@h+i,j=k*l?m=%24n"
`

const sharedWebURL = "http://127.0.0.1:33950/a-b.c_d~e/f:g@h+i,j=k*l?m=%24n"

// A cockpit's owner cannot make another user's env reader run anything or read another value:
// every config that would is refused at the write (EINVAL, one events line, config unchanged),
// and what is accepted reads as written in every reader docs/env.md names.
func TestSharedEnvRunsNothing(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	mark := filepath.Join(t.TempDir(), "ran")
	ownershipNobodyOK(m, "mkdir $M/evil && cat > $M/evil/config <<'EOF'\n"+sharedSafeConfig+"EOF")
	web := func(path string) string {
		return "[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = 33950\n[entrypoints.web]\nport = \"HTTP\"\npath = " + path + "\n"
	}
	bases := func(lines string) string { return "[ports]\nstep = 10\ncount = 4\n[ports.bases]\n" + lines + "\n" }
	attacks := map[string]string{
		"command substitution":  web("'/$(id>" + mark + ")'"),
		"backquotes":            web("'/`id>" + mark + "`'"),
		"semicolon":             web("'/;id>" + mark + "'"),
		"ampersand":             web("'/&id>" + mark + "'"),
		"pipe":                  web("'/|id>" + mark + "'"),
		"newline":               web(`"/\nid>` + mark + `"`),
		"ESC":                   web(`"/\u001b]0;pwned\u0007"`),
		"double quote":          web(`'/"'`),
		"single quote":          web(`"/'"`),
		"backslash":             web(`'/a\b'`),
		"dollar":                web(`'/$HOME'`),
		"hash":                  web(`'/a#b'`),
		"tilde after colon":     web(`'/x:~root'`),
		"port key PATH":         bases("PATH = 33950"),
		"port key BASH_ENV":     bases("BASH_ENV = 33950"),
		"port key LD_PRELOAD":   bases("LD_PRELOAD = 33950"),
		"port key HOME":         bases("HOME = 33950"),
		"port key NODE_OPTIONS": bases("NODE_OPTIONS = 33950"),
		"name with a dot":       bases("HTTP = 33950") + "[entrypoints.\"a.b\"]\nport = \"HTTP\"\npath = \"/\"\n",
		"prefix LD_":            bases("PRELOAD = 33950") + "[env]\nprefix = \"LD_\"\n",
	}
	for name, config := range attacks {
		lines := claimsEventCount(m, "evil/events")
		ownershipNobodyRefused(m, "cat > $M/evil/config <<'EOF'\n"+config+"EOF", syscall.EINVAL)
		ev := claimsRefusalEvent(t, m, "evil/events", "PORT_FAMILY_OUT_OF_RANGE", "EINVAL")
		if claimsEventCount(m, "evil/events") != lines+1 || ev["uid"] != float64(65534) {
			t.Errorf("%s: want one refusal line of nobody's, got %v", name, ev)
		}
		if got := m.read("evil/config"); got != sharedSafeConfig {
			t.Fatalf("%s: the refused config changed it to:\n%s", name, got)
		}
	}

	// The victim claims a stack of nobody's cockpit and reads its env with each reader.
	m.ok("mkdir $M/evil/stacks/s && touch $M/evil/stacks/s/holders/me")
	env := m.Path("evil/stacks/s/env")
	if got, want := m.read("evil/stacks/s/env"), "HTTP=33950\nWEB_URL="+sharedWebURL+"\n"; got != want {
		t.Fatalf("env = %q, want %q", got, want)
	}
	want := "33950 " + sharedWebURL + "\n"
	for _, sh := range []string{"bash", "dash", "zsh"} {
		t.Run(sh, func(t *testing.T) {
			testtool.Need(t, sh)
			if got := m.ok(sh + ` -c 'set -a; . "$0"; set +a; echo "$HTTP $WEB_URL"' ` + env); got != want {
				t.Fatalf("%s reads %q, want %q", sh, got, want)
			}
		})
	}
	t.Run("python-dotenv", func(t *testing.T) {
		testtool.Need(t, "/usr/bin/python3")
		if r := m.sh("/usr/bin/python3 -c 'import dotenv'"); r.Code != 0 {
			testtool.Missing(t, "python3-dotenv")
		}
		got := m.ok(`/usr/bin/python3 -c 'import dotenv, sys; v = dotenv.dotenv_values(sys.argv[1]); print(v["HTTP"], v["WEB_URL"])' ` + env)
		if got != want {
			t.Fatalf("python-dotenv reads %q, want %q", got, want)
		}
	})
	t.Run("direnv", func(t *testing.T) {
		testtool.Need(t, "direnv")
		dir := t.TempDir()
		home := "HOME=" + dir + " XDG_DATA_HOME=" + dir + "/data XDG_CONFIG_HOME=" + dir + "/config "
		m.ok("cd " + dir + " && echo 'dotenv " + env + "' > .envrc && " + home + "direnv allow .")
		if got := m.ok("cd " + dir + " && " + home + `direnv exec . sh -c 'echo "$HTTP $WEB_URL"' 2>/dev/null`); got != want {
			t.Fatalf("direnv reads %q, want %q", got, want)
		}
	})
	t.Run("node", func(t *testing.T) {
		testtool.Need(t, "node")
		if r := m.sh("node --env-file=/dev/null -e 0"); r.Code != 0 {
			t.Skipf("this node has no --env-file (Node 20.6 or later has): %s", r.Stderr)
		}
		if got := m.ok("node --env-file=" + env + ` -e 'console.log(process.env.HTTP + " " + process.env.WEB_URL)'`); got != want {
			t.Fatalf("node reads %q, want %q", got, want)
		}
	})
	t.Run("docker-compose", func(t *testing.T) {
		testtool.Need(t, "docker-compose")
		dir := t.TempDir()
		compose := "version: \"3.8\"\nservices:\n  app:\n    image: app\n    environment:\n      WEB: ${WEB_URL}\n      PORT: ${HTTP}\n"
		if err := os.WriteFile(filepath.Join(dir, "compose.yml"), []byte(compose), 0o644); err != nil {
			t.Fatal(err)
		}
		got := m.ok("cd " + dir + " && DOCKER_HOST=unix://" + dir + "/no-daemon.sock docker-compose --env-file " + env + " -f compose.yml config")
		for _, line := range []string{"WEB: " + sharedWebURL + "\n", "PORT: '33950'\n"} {
			if !strings.Contains(got, line) {
				t.Fatalf("docker-compose config shows no %q:\n%s", line, got)
			}
		}
	})
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("a reader of the env ran nobody's command")
	}
}

// `cockpitfs exec` sets only names an env may export on top of the caller's environment: an env
// file naming PATH, LD_PRELOAD or a name no shell assigns (served by a daemon from before the
// rules, or any directory given as the stack) changes none of them, and exec says so.
func TestSharedExecSetsOnlyDeclaredNames(t *testing.T) {
	t.Parallel()
	stack := t.TempDir()
	if err := os.Mkdir(filepath.Join(stack, "holders"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := "PATH=25060\nLD_PRELOAD=/tmp/evil.so\nBASH_ENV=/tmp/evil\nA.B_URL=x\nHTTP=25060\n"
	if err := os.WriteFile(filepath.Join(stack, "env"), []byte(env), 0o644); err != nil {
		t.Fatal(err)
	}
	r := shIn(t, t.TempDir(), `"$B" exec --holder job "$S" -- /bin/sh -c 'echo "$PATH|${LD_PRELOAD-unset}|${BASH_ENV-unset}|$HTTP"'`, "B="+binary, "S="+stack)
	if want := os.Getenv("PATH") + "|unset|unset|25060\n"; r.Code != 0 || r.Stdout != want {
		t.Fatalf("exec: exit %d, stdout %q, want %q\nstderr: %s", r.Code, r.Stdout, want, r.Stderr)
	}
	for _, name := range []string{"not setting PATH, which", "not setting LD_PRELOAD", "not setting BASH_ENV", `not setting "A.B_URL"`} {
		if !strings.Contains(r.Stderr, name) {
			t.Errorf("exec does not say %q:\n%s", name, r.Stderr)
		}
	}
}

// A drain target names nothing outside what the executor reclaims: "..", an absolute path, an
// option or a control byte is refused at the request (EINVAL, one events line, nothing changed),
// and the shipped executor, given WORK, removes nothing outside it, a link in WORK included.
func TestSharedDrainTargetsStayInWork(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 33980}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	root := t.TempDir()
	work, victim := filepath.Join(root, "a", "b", "work"), filepath.Join(root, "victimdir")
	for _, dir := range []string{work, filepath.Join(victim, "x")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, target := range []string{"volume:../../../victimdir", "volume:db/../../x", "volume:" + victim, victim,
		"volume:-rf", `$'volume:\e[2Jdb'`, "volume:", "volume:."} {
		ev := drainRefused(t, m, "s", "echo down "+target+" > $M/app/stacks/s/drain/request", syscall.EINVAL, "STATE_RECORD_MALFORMED")
		if !strings.Contains(fmt.Sprint(ev["message"]), "target") {
			t.Errorf("%s: the refusal does not say why: %v", target, ev["message"])
		}
	}

	// A link in WORK leads out of it: the executor refuses that reclaim (its outcome failure)
	// and the directory it leads to stays.
	if err := os.Symlink(victim, filepath.Join(work, "link")); err != nil {
		t.Fatal(err)
	}
	script, err := filepath.Abs("../examples/drain-executor.sh")
	if err != nil {
		t.Fatal(err)
	}
	r := m.sh(fmt.Sprintf("DRAIN='down volume:link/x' WORK=%s %s %s", work, script, drainDir("s")))
	if r.Code == 0 || !strings.Contains(r.Stderr, "is not inside "+work) {
		t.Fatalf("the executor reclaimed through a link out of WORK: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(victim, "x")); err != nil {
		t.Fatalf("the directory outside WORK is gone: %v", err)
	}
	if att := drainJSON(t, m, "app/stacks/s/drain/attempt"); att["status"] != "failed" || att["currentTarget"] != "volume:link/x" {
		t.Fatalf("attempt after the refused reclaim: %v", att)
	}
	// The Makefile resumes the same drain and refuses the same.
	makefile, err := filepath.Abs("../examples/Makefile.drain")
	if err != nil {
		t.Fatal(err)
	}
	r = m.sh(fmt.Sprintf("make -s -f %s down S=%s WORK=%s VOLUMES=link/x", makefile, drainDir("s"), work))
	if r.Code == 0 || !strings.Contains(r.Stderr, "is not inside "+work) {
		t.Fatalf("make down reclaimed through a link out of WORK: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(victim, "x")); err != nil {
		t.Fatalf("the directory outside WORK is gone: %v", err)
	}
}

// sharedControlBytes says whether text holds a character a terminal acts on (C0, DEL, C1), a
// newline aside.
func sharedControlBytes(text string) bool {
	return strings.ContainsFunc(text, func(r rune) bool { return r != '\n' && unicode.IsControl(r) })
}

// A co-user's checkout path (its working directory, or checkout= in a write) with a newline, ESC
// or BEL stays one escaped line in its holder file and in status, writes nothing a terminal acts
// on, and reads back exactly from status.json.
func TestSharedCheckoutIsOneEscapedLine(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	m.setupApp(4, map[string]int{"HTTP": 33990}, "s")
	m.ok("chmod o+w $M/app/stacks/s") // open to nobody's holders
	base, err := os.MkdirTemp("/tmp", "cockpitfs-shared")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	os.Chmod(base, 0o777) // nobody makes its working directory there
	cwd := filepath.Join(base, "x\nstate=dead\nuid=0\x1b[31m\u009b2J")
	named := "/tmp/\x1b]0;pwned\x07"
	ownershipNobodyOK(m, `d=$(printf '`+filepath.Join(base, `x\nstate=dead\nuid=0\033[31m\302\2332J`)+`') && mkdir "$d" && cd "$d" && touch $M/app/stacks/s/holders/nob`)
	ownershipNobodyOK(m, `echo "checkout=$(printf '/tmp/\033]0;pwned\007')" > $M/app/stacks/s/holders/nob2`)

	for holder, path := range map[string]string{"nob": cwd, "nob2": named} {
		text := m.read("app/stacks/s/holders", holder)
		if sharedControlBytes(text) || strings.Count(text, "\nstate=") != 1 || strings.Count(text, "\nuid=") != 1 || !strings.Contains(text, "\nuid=65534\n") {
			t.Fatalf("holders/%s reads %q", holder, text)
		}
		if want := "\ncheckout_path=" + strconv.QuoteToASCII(path)[1:len(strconv.QuoteToASCII(path))-1] + "\n"; !strings.Contains(text, want) {
			t.Fatalf("holders/%s reads %q, want a line %q", holder, text, want)
		}
	}
	status := m.read("status")
	if sharedControlBytes(status) || strings.Count(status, "\n") != 3 { // the header and a row per holder
		t.Fatalf("status reads %q", status)
	}
	// The JSON views escape what JSON itself leaves raw: DEL and C1 controls (\u009b is CSI).
	for _, view := range []string{"status.json", "app/stacks/s/record"} {
		if text := m.read(view); sharedControlBytes(text) {
			t.Fatalf("%s reads %q", view, text)
		}
	}
	var st struct {
		Cockpits []struct {
			Stacks []struct {
				Holders []struct{ Name, Checkout string }
			}
		}
	}
	if err := json.Unmarshal([]byte(m.read("status.json")), &st); err != nil {
		t.Fatal(err)
	}
	holders := st.Cockpits[0].Stacks[0].Holders
	if len(holders) != 2 || holders[0].Checkout != cwd || holders[1].Checkout != named {
		t.Fatalf("status.json holders: %+v", holders)
	}
	// A name with a control character is refused, and the events line that says so holds none.
	ownershipNobodyRefused(m, `touch "$M/app/stacks/s/holders/$(printf 'a\302\2332J')"`, syscall.EINVAL)
	if ev := m.lastEvent("app/stacks/s/events"); sharedControlBytes(ev) || !strings.Contains(ev, `"errno":"EINVAL"`) {
		t.Fatalf("the refusal's line: %q", ev)
	}
}

// sharedSquat runs, as nobody and in the daemon's network namespace, one python3 process holding
// the legacy names of ports (as an older daemon holds them), as mode says: "bound" (not listening), "silent" (listening, never
// accepting), or "answer" (answering each asker as a daemon would, naming its own pid and root's
// uid, data directory and lease).
func sharedSquat(m *mount, mode string, ports ...int) *exec.Cmd {
	m.t.Helper()
	// Debian's python3: one on root's PATH may be root's alone.
	args := []string{"--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", `import json, os, select, socket, sys
mode = sys.argv[1]
socks = {}
for port in sys.argv[2:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(b"\0cockpitfs/port/" + port.encode())
    if mode != "bound":
        s.listen(1)
    socks[s] = int(port)
print("bound", flush=True)
while True:
    ready, _, _ = select.select(list(socks) if mode == "answer" else [], [], [], 600)
    for s in ready:
        c, _ = s.accept()
        try:
            c.sendall(json.dumps({"daemon": "cockpitfs", "pid": os.getpid(), "uid": 0, "data": "/var/lib/cockpitfs\x1b[31m",
                "mount": "/cockpit", "cockpit": "app", "stack": "prod", "key": "HTTP", "port": socks[s]}).encode() + b"\n")
        except OSError:
            pass  # an asker that did not wait for the answer
        c.close()`, mode}
	for _, port := range ports {
		args = append(args, strconv.Itoa(port))
	}
	cmd := exec.Command("setpriv", args...)
	return m.startBound(cmd)
}

// A co-user's process holding a port's name is named by the kernel — its pid and uid — however
// it answers: a forger's words (root's uid, a data directory, a lease, ESC) are in no refusal and
// no ports/ file, and its family is in the way as a listener's is (EADDRINUSE). Holders that never
// answer, or do not listen, cost no wait and no scan of /proc per name (-v logs what 60 cost).
func TestSharedPortHolderIsWhatTheKernelSays(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "/usr/bin/python3")
	m := ownershipMount(t, "--allow-other")
	const base = 34000
	m.setupApp(1, map[string]int{"HTTP": base}, "s")
	forger := sharedSquat(m, "answer", base)
	pid := strconv.Itoa(forger.Process.Pid)
	if got := m.read("ports", strconv.Itoa(base)); got != "daemon=none pid="+pid+" uid=65534\n" {
		t.Fatalf("ports/%d reads %q", base, got)
	}
	before := claimsSnapshot(m, "s")
	m.refused("touch $M/app/stacks/s/holders/me", syscall.EADDRINUSE)
	ev := claimsRefusalEvent(t, m, "app/stacks/s/events", "PORT_FAMILY_COLLISION", "EADDRINUSE")
	if msg := fmt.Sprint(ev["message"]); !strings.Contains(msg, "port "+strconv.Itoa(base)+" held by process "+pid+" uid 65534, not a cockpitfs daemon") ||
		strings.Contains(msg, "/var/lib/cockpitfs") || strings.Contains(msg, "prod") {
		t.Fatalf("the refusal: %s", msg)
	}
	if after := claimsSnapshot(m, "s"); after != before {
		t.Fatalf("a refused claim changed state:\n%s\n---\n%s", before, after)
	}

	// 60 families held by two processes, one never answering, one not even listening; the 61st
	// free.
	const families = 60
	m.ok("mkdir $M/wide && printf '[ports]\\nstep = 10\\ncount = 61\\n[ports.bases]\\nHTTP = 35000\\n' > $M/wide/config && mkdir $M/wide/stacks/s")
	var ports []int
	for i := range families {
		ports = append(ports, 35000+10*i)
	}
	silent, bound := sharedSquat(m, "silent", ports[:families/2]...), sharedSquat(m, "bound", ports[families/2:]...)
	start := time.Now()
	listing := m.ok("cat $M/ports/*")
	listed := time.Since(start)
	for _, squatter := range []*exec.Cmd{silent, bound} {
		if strings.Count(listing, "daemon=none pid="+strconv.Itoa(squatter.Process.Pid)+" uid=65534\n") != families/2 {
			t.Fatalf("ports/ lists:\n%s", listing)
		}
	}
	start = time.Now()
	m.ok("touch $M/wide/stacks/s/holders/me")
	claimed := time.Since(start)
	if got := m.read("wide/stacks/s/ports/HTTP"); got != strconv.Itoa(35000+10*families)+"\n" {
		t.Fatalf("past %d squatted families, HTTP = %q", families, got)
	}
	t.Logf("%d squatted names: cat ports/* %v, a claim past them %v", families, listed, claimed)
}

// The documents a user's cat shows as another user wrote them — a cockpit's config, a stack's
// declared-values, which any of its holders may write — hold no control character a terminal
// acts on: a co-user's ESC, BEL, C1 CSI or right-to-left override, comments included, is
// refused (EINVAL, one events line, the document unchanged).
func TestSharedDocumentsHoldNoTerminalControls(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	m.setupApp(4, map[string]int{"HTTP": 34100}, "s")
	m.ok("chmod o+w $M/app/stacks/s") // open to nobody's holders
	ownershipNobodyOK(m, "touch $M/app/stacks/s/holders/nob && echo 'web=http://localhost:1/' > $M/app/stacks/s/declared-values")
	// coreutils' printf reports the close's errno, at which a whole document is judged.
	for _, doc := range []string{`# \033]0;pwned\007\nweb=x`, `# \302\2332J\nweb=x`, `# fine\rforged\nweb=x`, `# \342\200\256x=bew\nweb=x`} {
		lines := claimsEventCount(m, "app/stacks/s/events")
		ownershipNobodyRefused(m, `/usr/bin/printf '`+doc+`\n' > $M/app/stacks/s/declared-values`, syscall.EINVAL)
		ev := claimsRefusalEvent(t, m, "app/stacks/s/events", "STATE_RECORD_MALFORMED", "EINVAL")
		if claimsEventCount(m, "app/stacks/s/events") != lines+1 || !strings.Contains(fmt.Sprint(ev["message"]), "control character") {
			t.Fatalf("%s: %v", doc, ev)
		}
		if got := m.read("app/stacks/s/declared-values"); got != "web=http://localhost:1/\n" {
			t.Fatalf("%s: declared-values reads %q", doc, got)
		}
	}
	ownershipNobodyOK(m, "mkdir $M/nob && printf '[ports]\\nstep = 1\\ncount = 1\\n[ports.bases]\\nA = 34200\\n' > $M/nob/config")
	config := m.read("nob/config")
	ownershipNobodyRefused(m, `/usr/bin/printf '# \302\2332J\n[ports]\nstep = 1\ncount = 1\n[ports.bases]\nA = 34200\n' > $M/nob/config`, syscall.EINVAL)
	claimsRefusalEvent(t, m, "nob/events", "PORT_FAMILY_OUT_OF_RANGE", "EINVAL")
	if got := m.read("nob/config"); got != config {
		t.Fatalf("config reads %q", got)
	}
}
