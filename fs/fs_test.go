package fs

import "testing"

// An editor's scratch names are told from holder names without a claim: vim's write tests are
// 4913 to 5012 exactly.
func TestEditorScratch(t *testing.T) {
	for name, want := range map[string]bool{
		"4913": true, "5012": true, "4999": true, "4912": false, "5013": false, "04913": false, "+491": false,
		"491a": false, "-4913": false, "c": false, "": false, ".me.swp": true, ".me.swx": true, "me~": true,
		"#me#": true, ".#me": true, "me.save": true, "#": false, "##": false, "me": false,
	} {
		if got := editorScratch(name); got != want {
			t.Errorf("editorScratch(%q) = %v, want %v", name, got, want)
		}
	}
}
