package main

import (
	"slices"
	"testing"
)

// Every flag of a help line naming several (`--cert FILE, --key FILE`) is completed, not only the
// first.
func TestFlagNamesEveryFlagOfALine(t *testing.T) {
	for name, want := range map[string][]string{
		"mount":   {"--cacert", "--cert", "--key", "--user", "--password", "--store", "--command-timeout", "--data", "--allow-other"},
		"verify":  {"--cert", "--key", "--user", "--password"},
		"migrate": {"--cacert", "--cert", "--key", "--user", "--password"},
		"unmount": {"--lazy"},
	} {
		got := flagNames(name)
		for _, f := range want {
			if !slices.Contains(got, f) {
				t.Errorf("flagNames(%q) = %v: %s missing", name, got, f)
			}
		}
	}
}
