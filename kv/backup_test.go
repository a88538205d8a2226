package kv

import (
	"os"
	"path/filepath"
	"testing"
)

// The newest backup is the last by name (names are timestamps); none is "", and a backups
// directory that cannot be listed is an error, never "no backup".
func TestNewestBackup(t *testing.T) {
	dir := t.TempDir()
	if got, err := NewestBackup(dir); got != "" || err != nil {
		t.Fatalf("no backups directory: %q, %v", got, err)
	}
	backups := filepath.Join(dir, BackupDirName)
	if err := os.Mkdir(backups, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"20261201T101507.491605407Z.backup", "20261202T000000.000000001Z.backup", "zz-notes.txt"} {
		if err := os.WriteFile(filepath.Join(backups, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := NewestBackup(dir); got != filepath.Join(backups, "20261202T000000.000000001Z.backup") || err != nil {
		t.Fatalf("NewestBackup = %q, %v", got, err)
	}

	unlistable := t.TempDir()
	if err := os.WriteFile(filepath.Join(unlistable, BackupDirName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := NewestBackup(unlistable); err == nil {
		t.Fatalf("a backups path that is not a directory: %q, no error", got)
	}
}
