package engine

import (
	"strings"
	"testing"
)

func TestNameFor(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"app":                    "app",
		"app@v2":                 "app_v2",
		"app+fix":                "app_fix",
		"café":                   "caf_",
		".app":                   "_app",
		"-app":                   "_app",
		"my app":                 "my_app",
		"jane@corp.example":      "jane_corp.example",
		"":                       "_",
		"a\nb\x1b[31m":           "a_b__31m",
		strings.Repeat("x", 200): strings.Repeat("x", 128),
	} {
		if got := NameFor(in); got != want {
			t.Errorf("NameFor(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestStackNameFor(t *testing.T) {
	t.Parallel()
	// The README's Makefile made these before `cockpitfs name`: printf %s DIR | sha256sum | cut -c1-8.
	if got := StackNameFor("/home/me/src/app"); got != "app-"+digest("/home/me/src/app")[:8] {
		t.Errorf("StackNameFor = %q", got)
	}
	if a, b := StackNameFor("/a/app@v2"), StackNameFor("/b/app@v2"); a == b || !strings.HasPrefix(a, "app_v2-") {
		t.Errorf("two checkouts named app@v2: %q and %q", a, b)
	}
	if got := StackNameFor("/" + strings.Repeat("y", 300)); len(got) != maxNameBytes || !ValidName(got) {
		t.Errorf("a long folder's stack: %q (%d bytes)", got, len(got))
	}
}

// Whatever the text, the name is valid, and a valid name maps to itself.
func FuzzNameFor(f *testing.F) {
	for _, s := range []string{"app", "app@v2", "café", ".app", "", "\xff\xfe", "-", strings.Repeat("é", 100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		name := NameFor(s)
		if !ValidName(name) {
			t.Fatalf("NameFor(%q) = %q, not a valid name", s, name)
		}
		if NameFor(name) != name {
			t.Fatalf("NameFor(%q) = %q, which maps to %q", s, name, NameFor(name))
		}
		if ValidName(s) && name != s {
			t.Fatalf("the valid name %q maps to %q", s, name)
		}
		if stack := StackNameFor("/src/" + s); !ValidName(stack) {
			t.Fatalf("StackNameFor of folder %q = %q, not a valid name", s, stack)
		}
	})
}
