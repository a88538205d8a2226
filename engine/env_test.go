package engine

import (
	"context"
	"reflect"
	"testing"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
	"github.com/cockpitfs/cockpitfs/storage"
)

// A config accepted before the env rules (its Declared as stored) may declare a path a shell
// would run, a name a shell cannot assign, or a prefix that makes a reserved name: the env
// leaves each such line out and keeps the rest.
func TestEnvLeavesOutWhatAStoredConfigMayDeclare(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig+`[entrypoints.web]
port = "HTTP"
path = "/app"
`, "s")
	claim(t, e, "app", "s", "me")
	e.cockpits.begin()
	err := e.db.Update(context.Background(), func(tx storage.Txn) error {
		m, err := e.loadCockpit(tx, "app")
		if err != nil {
			return err
		}
		declared := *m.Declared
		declared.Entrypoints = []portdecl.Entrypoint{
			{Name: "run", Port: "HTTP", Path: "/$(id>/tmp/x)"},
			{Name: "a.b", Port: "HTTP", Path: "/"},
			{Name: "pip-index", Port: "HTTP", Path: "/simple"},
			{Name: "web", Port: "HTTP", Path: "/app"},
		}
		m.Declared = &declared
		return setJSON(tx, cockpitKey("app"), m)
	})
	e.cockpits.end()
	if err != nil {
		t.Fatal(err)
	}
	info, err := e.Cockpit("app")
	if err != nil {
		t.Fatal(err)
	}
	// A.B_URL no shell assigns, pip reads PIP_INDEX_URL, and RUN_URL's value runs id.
	got := stackRecord(t, e, "app", "s").EnvFor(info)
	want := []EnvVar{{"DB", "15432"}, {"HTTP", "18080"}, {"WEB_URL", "http://127.0.0.1:18080/app"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("env = %v, want %v", got, want)
	}
}

// The [env] derived values render on each stack's facts after its ports and URLs, by name.
func TestEnvRendersDerivedValues(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig+`[entrypoints.api]
port = "HTTP"
path = "/api"
[env]
COMPOSE_PROJECT_NAME = "{cockpit}-{stack}"
DB_NAME = "app_{checkout}"
VITE_API_URL = "http://localhost:{port.HTTP}"
API_V1 = "{url.api}/v1"
`, "s")
	claim(t, e, "app", "s", "me")
	info, err := e.Cockpit("app")
	if err != nil {
		t.Fatal(err)
	}
	got := stackRecord(t, e, "app", "s").EnvFor(info)
	want := []EnvVar{{"DB", "15432"}, {"HTTP", "18080"}, {"API_URL", "http://127.0.0.1:18080/api"},
		{"API_V1", "http://127.0.0.1:18080/api/v1"}, {"COMPOSE_PROJECT_NAME", "app-s"}, {"DB_NAME", "app_me"},
		{"VITE_API_URL", "http://localhost:18080"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("env = %v, want %v", got, want)
	}
}
