package portdecl

import (
	"reflect"
	"strings"
	"testing"
)

var derivedDoc = ports + entrypoint("api", `port = "HTTP"`, `path = "/api"`) + `[env]
prefix = "APP_"
COMPOSE_PROJECT_NAME = "{cockpit}-{stack}"
DB_NAME = "app_{checkout}"
VITE_API_URL = "http://localhost:{port.HTTP}"
API = "{url.api}/v1"
PLAIN = "on"
`

func TestParseDerived(t *testing.T) {
	cfg, err := Parse([]byte(derivedDoc))
	if err != nil {
		t.Fatal(err)
	}
	want := []Derived{
		{"API", "{url.api}/v1"},
		{"COMPOSE_PROJECT_NAME", "{cockpit}-{stack}"},
		{"DB_NAME", "app_{checkout}"},
		{"PLAIN", "on"},
		{"VITE_API_URL", "http://localhost:{port.HTTP}"},
	}
	if !reflect.DeepEqual(cfg.Derived, want) || cfg.EnvPrefix != "APP_" {
		t.Fatalf("derived %+v prefix %q, want %+v under APP_", cfg.Derived, cfg.EnvPrefix, want)
	}
	facts := Facts{Cockpit: "shop", Stack: "feat-x", Checkout: "feat-x", Ports: map[string]int{"HTTP": 8090, "DB": 5442},
		URLs: map[string]string{"api": "http://127.0.0.1:8090/api"}}
	rendered := map[string]string{}
	for _, d := range cfg.Derived {
		v, ok := d.Render(facts)
		if !ok {
			t.Fatalf("%s did not render", d.Name)
		}
		rendered[d.Name] = v
	}
	wantValues := map[string]string{"API": "http://127.0.0.1:8090/api/v1", "COMPOSE_PROJECT_NAME": "shop-feat-x",
		"DB_NAME": "app_feat-x", "PLAIN": "on", "VITE_API_URL": "http://localhost:8090"}
	if !reflect.DeepEqual(rendered, wantValues) {
		t.Fatalf("rendered %v, want %v", rendered, wantValues)
	}
}

func TestParseDerivedRefuses(t *testing.T) {
	env := func(lines ...string) string {
		return ports + entrypoint("api", `port = "HTTP"`, `path = "/"`) + "[env]\n" + strings.Join(lines, "\n") + "\n"
	}
	for _, tc := range []struct{ name, doc, want string }{
		{"unknown fact", env(`X = "{branch}"`), "env.X: {branch} is not a placeholder"},
		{"unknown port key", env(`X = "{port.WEB}"`), `env.X: {port.WEB}: "WEB" is not a key of [ports.bases]`},
		{"undeclared entrypoint", env(`X = "{url.web}"`), `env.X: {url.web}: "web" is not a declared entrypoint`},
		{"default entrypoints are not declared", env(`X = "{url.http}"`), `"http" is not a declared entrypoint`},
		{"unclosed placeholder", env(`X = "a{stack"`), "no placeholder"},
		{"stray brace", env(`X = "a}"`), "no placeholder"},
		{"dollar", env(`X = "$(id)"`), `env.X: "$(id)": "$" at byte 0`},
		{"space", env(`X = "a b"`), "byte 0x20 at byte 1"},
		{"hash", env(`X = "a#b"`), `"#" at byte 1`},
		{"quote", env(`X = "it's"`), `"'" at byte 2`},
		{"tilde", env(`X = "~/{stack}"`), "write %7E"},
		{"newline", env(`X = "a\nB=1"`), "byte 0x0a"},
		{"not a string", env(`X = 5`), "env.X: must be a string, got integer 5"},
		{"reserved name", env(`PATH = "{stack}"`), "env.PATH: the env file would export PATH, which shells"},
		{"reserved family", env(`COMPOSE_FILE = "x.yml"`), "env.COMPOSE_FILE: the env file would export COMPOSE_FILE"},
		{"lower-case prefix key is a name", env(`"a.b" = "x"`), `env."a.b": the env file would export "a.b"`},
		{"a port key's name", env(`HTTP = "{stack}"`), "env.HTTP: port key HTTP sets HTTP too"},
		{"an entrypoint's name", env(`prefix = "A_"`, `A_API_URL = "x"`), "env.A_API_URL: entrypoint api sets A_API_URL too"},
		{"too long", env(`X = "` + strings.Repeat("a", 257) + `"`), "more than 256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// A template that parsed renders nothing when the stack lacks a fact, or when a fact renders a
// value no env reader reads as written.
func TestRenderLeavesOutWhatCannotRender(t *testing.T) {
	facts := Facts{Cockpit: "c", Stack: "s", Ports: map[string]int{"HTTP": 8080}, URLs: map[string]string{"odd": "http://h:1/a:"}}
	for _, template := range []string{"{checkout}", "{port.DB}", "{url.gone}", "{url.odd}~x"} {
		if v, ok := (Derived{"X", template}).Render(facts); ok {
			t.Errorf("%q rendered %q", template, v)
		}
	}
	if v, ok := (Derived{"X", "{stack}-{port.HTTP}"}).Render(facts); !ok || v != "s-8080" {
		t.Errorf("rendered %q %t", v, ok)
	}
}

func TestCheckDerivedValue(t *testing.T) {
	for value, ok := range map[string]bool{
		"": true, "app-1": true, "http://localhost:8080/x": true, "a=b": true, "%20": true, "/~user": true,
		"~": false, "a:~": false, "a=~": false, "%2": false, "a&b": false, "a;b": false, "a\\b": false, "`x`": false, "é": false,
	} {
		if err := CheckDerivedValue(value); (err == nil) != ok {
			t.Errorf("CheckDerivedValue(%q) = %v, want ok %t", value, err, ok)
		}
	}
}

// In a document still being written, a placeholder may name a port key or entrypoint a later
// line can still declare.
func TestParsePrefixWaitsForDerivedFacts(t *testing.T) {
	if err := ParsePrefix([]byte("[env]\nX = \"{port.HTTP}-{url.web}\"\n")); err != nil {
		t.Fatalf("a prefix before [ports] refused: %v", err)
	}
	// HTTP is a port key's name until a prefix follows.
	whole := ports + "[env]\nHTTP = \"{stack}\"\nprefix = \"APP_\"\n"
	if _, err := Parse([]byte(whole)); err != nil {
		t.Fatalf("the whole document refused: %v", err)
	}
	if err := ParsePrefix([]byte(whole[:strings.Index(whole, "prefix")])); err != nil {
		t.Fatalf("a prefix before its [env] prefix refused: %v", err)
	}
	if err := ParsePrefix([]byte(ports + "[env]\nX = \"{port.WEB}\"\n")); err == nil {
		t.Fatal("a port key [ports.bases] can no longer gain was accepted")
	}
}
