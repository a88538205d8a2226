package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The build the README gives (no -tags team) links no etcd client, serves a data directory, and
// refuses --store with exit 2, naming the build that has team mode, before anything is made.
func TestBuildWithoutTeamMode(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "cockpitfs")
	build := exec.Command("go", "build", "-o", bin, "../cmd/cockpitfs")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	deps, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatalf("go version -m: %v", err)
	}
	for _, module := range []string{"go.etcd.io/etcd/client/v3", "google.golang.org/grpc", "go.uber.org/zap"} {
		if strings.Contains(string(deps), "\tdep\t"+module+"\t") {
			t.Errorf("the build without team mode links %s", module)
		}
	}

	if r := runCLI(t, bin, "version"); r.code != 0 || !strings.HasSuffix(r.out, ", without team mode (etcd: build with -tags team)\n") {
		t.Errorf("version of the build without team mode: exit %d, %q", r.code, r.out)
	}
	if r := cockpitfs(t, "version"); r.code != 0 || !strings.HasSuffix(r.out, ", with team mode (etcd)\n") {
		t.Errorf("version of the build with team mode: exit %d, %q", r.code, r.out)
	}

	dir := t.TempDir()
	data, mnt := filepath.Join(dir, "data"), filepath.Join(dir, "mnt")
	const store = "etcd://127.0.0.1:1/team"
	for _, args := range [][]string{
		{"mount", "--data", data, "--store", store, mnt},
		{"mount", "--daemon", "--data", data, "--store", store, mnt},
		{"verify", "--data", data, "--store", store},
		{"migrate", store, data},
	} {
		r := runCLI(t, bin, args...)
		if r.code != 2 || !strings.Contains(r.out, "built without team mode") ||
			!strings.Contains(r.out, "go build -tags team -o ~/.local/bin/cockpitfs ./cmd/cockpitfs") || strings.Contains(r.out, "usage:") {
			t.Errorf("cockpitfs %s: exit %d\n%s", strings.Join(args, " "), r.code, r.out)
		}
		for _, made := range []string{data, mnt} {
			if _, err := os.Lstat(made); !os.IsNotExist(err) {
				t.Fatalf("cockpitfs %s made %s (%v)", strings.Join(args, " "), made, err)
			}
		}
	}

	m := &mount{t: t, ns: ownNetns(t), Dir: mnt, Data: data, program: bin}
	m.start()
	t.Cleanup(m.stop)
	m.setupApp(20, map[string]int{"HTTP": 33080}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	if got := m.read("app/stacks/s/ports/HTTP"); got != "33080\n" {
		t.Fatalf("ports/HTTP = %q", got)
	}
}
