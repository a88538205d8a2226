package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// derivedConfig declares the recipes of docs/env.md: a compose project, a database name and
// derived URLs.
const derivedConfig = `[ports]
step = 10
count = 4
[ports.bases]
FRONTEND = 51080
BACKEND = 51180
[entrypoints.api]
port = "BACKEND"
path = "/api"
[env]
COMPOSE_PROJECT_NAME = "{cockpit}-{stack}"
DB_NAME = "app_{checkout}"
VITE_API_URL = "http://localhost:{port.BACKEND}"
API_V1 = "{url.api}/v1"
`

// The [env] derived values render into env, which bash's `set -a; . ./env`, docker-compose's
// `config` and `cockpitfs exec` read as written; a config naming a fact it does not declare is
// refused with EINVAL, an events line, and the accepted config unchanged.
func TestEnvDerivedValues(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	checkout := filepath.Join(t.TempDir(), "feature-login")
	if err := os.Mkdir(checkout, 0o755); err != nil {
		t.Fatal(err)
	}
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + derivedConfig + "EOF\n")
	m.ok("mkdir $M/app/stacks/s")
	if r := shIn(t, checkout, `touch "$M/app/stacks/s/holders/me"`, "M="+m.Dir); r.Code != 0 {
		t.Fatalf("claim from the checkout: %s\n%s\n%s", r.Stderr, m.read("app/events"), m.read("app/stacks/s/events"))
	}
	want := "BACKEND=51180\nFRONTEND=51080\nAPI_URL=http://127.0.0.1:51180/api\nAPI_V1=http://127.0.0.1:51180/api/v1\n" +
		"COMPOSE_PROJECT_NAME=app-s\nDB_NAME=app_feature-login\nVITE_API_URL=http://localhost:51180\n"
	if got := m.read("app/stacks/s/env"); got != want {
		t.Fatalf("env = %q, want %q", got, want)
	}
	got := m.ok(`cd $M/app/stacks/s && bash -c 'set -a; . ./env; set +a; echo "$COMPOSE_PROJECT_NAME $DB_NAME $VITE_API_URL $API_V1"'`)
	if got != "app-s app_feature-login http://localhost:51180 http://127.0.0.1:51180/api/v1\n" {
		t.Fatalf("bash sourced: %q", got)
	}
	r := shIn(t, t.TempDir(), `"$B" exec --holder job "$M/app/stacks/s" -- sh -c 'echo "$COMPOSE_PROJECT_NAME $VITE_API_URL"'`, "M="+m.Dir, "B="+binary)
	if r.Code != 0 || r.Stdout != "app-s http://localhost:51180\n" {
		t.Fatalf("exec's environment: exit %d, %q\n%s", r.Code, r.Stdout, r.Stderr)
	}
	t.Run("docker-compose", func(t *testing.T) {
		testtool.Need(t, "docker-compose")
		dir := t.TempDir()
		compose := "version: \"3.8\"\nservices:\n  web:\n    image: web\n    environment:\n      VITE_API_URL: ${VITE_API_URL}\n" +
			"      PROJECT: ${COMPOSE_PROJECT_NAME}\n      POSTGRES_DB: ${DB_NAME}\n"
		if err := os.WriteFile(filepath.Join(dir, "compose.yml"), []byte(compose), 0o644); err != nil {
			t.Fatal(err)
		}
		// `config` resolves the file and talks to no docker daemon: none is reachable here.
		got := m.ok("cd " + dir + " && DOCKER_HOST=unix://" + dir + "/no-daemon.sock docker-compose --env-file " + m.Path("app/stacks/s/env") + " -f compose.yml config")
		for _, want := range []string{"VITE_API_URL: http://localhost:51180\n", "PROJECT: app-s\n", "POSTGRES_DB: app_feature-login\n"} {
			if !strings.Contains(got, want) {
				t.Fatalf("docker-compose config shows no %q:\n%s", want, got)
			}
		}
	})
	for _, tc := range []struct{ name, line, why string }{
		{"unknown port key", `X = "{port.DB}"`, `env.X: {port.DB}: "DB" is not a key of [ports.bases]`},
		{"unknown fact", `X = "{branch}"`, "env.X: {branch} is not a placeholder"},
		{"undeclared entrypoint", `X = "{url.web}"`, `"web" is not a declared entrypoint`},
		{"a byte a shell runs", `X = "{stack};id"`, `";" at byte 7`},
		{"a reserved name", `NODE_OPTIONS = "{stack}"`, "env.NODE_OPTIONS: the env file would export NODE_OPTIONS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := claimsEventCount(m, "app/events")
			m.refused("cat > $M/app/config <<'EOF'\n"+derivedConfig+tc.line+"\nEOF", syscall.EINVAL)
			ev := claimsRefusalEvent(t, m, "app/events", "PORT_FAMILY_OUT_OF_RANGE", "EINVAL")
			if msg := fmt.Sprint(ev["message"]); !strings.Contains(msg, tc.why) {
				t.Errorf("refused for %q, want a message naming %q", msg, tc.why)
			}
			if got := claimsEventCount(m, "app/events"); got != lines+1 {
				t.Errorf("events lines %d -> %d, want one more", lines, got)
			}
			if got := m.read("app/config"); got != derivedConfig {
				t.Fatalf("a refused config replaced the accepted one: %q", got)
			}
			if got := m.read("app/stacks/s/env"); got != want {
				t.Fatalf("env after a refused config = %q", got)
			}
		})
	}
}
