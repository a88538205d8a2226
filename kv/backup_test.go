package kv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// The newest backup is the one of the highest sequence, whatever its name says (a clock that ran
// ahead named one in the future); version 1 backups (no sequence) come before every numbered
// one, by the time they say they were taken. None is "", and a backups directory that cannot be
// listed is an error, never "no backup".
func TestNewestBackup(t *testing.T) {
	dir := t.TempDir()
	if got, err := NewestBackup(dir); got != "" || err != nil {
		t.Fatalf("no backups directory: %q, %v", got, err)
	}
	backups := filepath.Join(dir, BackupDirName)
	if err := os.Mkdir(backups, 0o700); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"20990101T000000.000000000Z.backup": "cockpitfs-backup 2 4070908800000000000 seq=2 records=0\n",
		"20261201T101507.491605407Z.backup": "cockpitfs-backup 2 1796119000000000000 seq=3 records=0\n",
		"20980101T000000.000000000Z.backup": "cockpitfs-backup 1 4039372800000000000\n",
		"20250101T000000.000000000Z.backup": "cockpitfs-backup 1 1735689600000000000\n",
		"zz-notes.txt":                      "cockpitfs-backup 2 1 seq=99 records=0\n",
		"20270101T000000.000000000Z.backup": "not a backup\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(backups, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := NewestBackup(dir); got != filepath.Join(backups, "20261201T101507.491605407Z.backup") || err != nil {
		t.Fatalf("NewestBackup = %q, %v", got, err)
	}
	list, err := listBackups(backups)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, b := range list {
		order = append(order, filepath.Base(b.path))
	}
	want := "[20250101T000000.000000000Z.backup 20980101T000000.000000000Z.backup 20990101T000000.000000000Z.backup 20261201T101507.491605407Z.backup]"
	if got := fmt.Sprint(order); got != want {
		t.Fatalf("order %s, want %s", got, want)
	}
	if seq, err := NextBackupSeq(dir); seq != 4 || err != nil {
		t.Fatalf("NextBackupSeq = %d, %v", seq, err)
	}

	unlistable := t.TempDir()
	if err := os.WriteFile(filepath.Join(unlistable, BackupDirName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := NewestBackup(unlistable); err == nil {
		t.Fatalf("a backups path that is not a directory: %q, no error", got)
	}
}
