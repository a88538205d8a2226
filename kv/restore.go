package kv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
)

// A restore replaces the store in a data directory by a backup, and a kill at any point leaves
// either the store it replaces, or the restored one, or a directory every Open refuses, naming
// the restore to finish:
//
//  1. the restored store is built whole in dir/restore-staged and synced (killed here: the
//     store is untouched; the next restore, or Open, removes the staged one);
//  2. dir/RESTORING is written (a temporary file, synced, renamed): the restore's intent, naming
//     the backup, the staged files and the directory the replaced store moves to;
//  3. the replaced store's files move into dir/damaged-<time>; 4. the staged files move into dir;
//  5. dir/restore-staged is removed, the report is made (the replaced store read where it lies)
//     and said, and dir/RESTORING is removed: a restore killed before it said what is lost and
//     how to undo it is unfinished, and finishing it says so.
//
// From 2 until 5 ends, Open refuses with *UnfinishedRestoreError, and FinishRestore completes
// the moves: every staged file still staged means 3 may not have ended (whatever store files dir
// holds are the replaced store's); one staged file moved means 3 ended.

// restoreIntentName is the restore's intent in the data directory (see above).
const restoreIntentName = "RESTORING"

// restoreStagedName is where a restore builds the restored store, inside the data directory.
const restoreStagedName = "restore-staged"

// restoreIntent is what dir/RESTORING holds.
type restoreIntent struct {
	Backup string    `json:"backup"`
	Taken  time.Time `json:"taken"`
	Aside  string    `json:"aside"`  // the directory of dir the replaced store moves to, its name
	Staged []string  `json:"staged"` // the restored store's files, in dir/restore-staged
}

// UnfinishedRestoreError is a data directory a killed restore left between the store it
// replaces and the restored one: FinishRestore completes it.
type UnfinishedRestoreError struct {
	Dir, Backup, Aside string
}

func (e *UnfinishedRestoreError) Error() string {
	return fmt.Sprintf("%s holds an unfinished restore of %s (the replaced store moves to %s): it is neither the store it replaces nor the restored one", e.Dir, e.Backup, e.Aside)
}

// UnfinishedRestore returns the *UnfinishedRestoreError of dir's intent, nil when there is none.
func UnfinishedRestore(dir string) error {
	intent, err := readRestoreIntent(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	}
	return &UnfinishedRestoreError{Dir: dir, Backup: intent.Backup, Aside: filepath.Join(dir, intent.Aside)}
}

func readRestoreIntent(dir string) (restoreIntent, error) {
	var intent restoreIntent
	data, err := os.ReadFile(filepath.Join(dir, restoreIntentName))
	if err != nil {
		return intent, err
	}
	if err := json.Unmarshal(data, &intent); err != nil {
		// Written whole and renamed into place: a partial one is never seen.
		return intent, fmt.Errorf("kv: %s is unreadable: %w", filepath.Join(dir, restoreIntentName), err)
	}
	return intent, nil
}

// RestoreReport says what a restore did and what it could not bring back.
type RestoreReport struct {
	Backup   string
	Taken    time.Time
	Restored int
	// MovedTo is where the store that was replaced now lies, untouched.
	MovedTo string
	// Salvaged is false when the replaced store could not be read at all; everything committed
	// after Taken is then lost.
	Salvaged   bool
	SalvageErr error
	// Unreadable names the replaced store's files that could not be read (or only in part):
	// what only they held is lost too.
	Unreadable []string
	// Lost lists the keys the replaced store held (as far as it could be read) that the backup
	// does not hold with the same value: "key: missing" or "key: differs".
	Lost []string
}

// Restore replaces the store in dir by the backup at path (see the steps above). The store it
// replaces is moved, whole and unchanged, into dir/damaged-<time>; its readable records are
// compared with the backup to report what is lost, and say is given the report before the
// restore ends. It refuses with *HeldError while a daemon holds dir, and with
// *UnfinishedRestoreError while a killed restore is unfinished.
func Restore(dir, path string, say func(*RestoreReport)) error {
	backup, err := ReadBackup(path)
	if err != nil {
		return err
	}
	lock, err := lockDir(dir)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := UnfinishedRestore(dir); err != nil {
		return err
	}
	staged := filepath.Join(dir, restoreStagedName)
	if err := os.RemoveAll(staged); err != nil { // a restore killed before its intent
		return fmt.Errorf("kv: %w", err)
	}
	if err := stageRestore(staged, lock, backup); err != nil {
		os.RemoveAll(staged)
		return err
	}
	files, err := storeFiles(staged)
	if err != nil {
		return err
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs // finished later, maybe from another directory
	}
	intent := restoreIntent{Backup: path, Taken: backup.Taken, Aside: filepath.Base(asideName(dir)), Staged: files}
	if err := writeRestoreIntent(dir, intent); err != nil {
		return err
	}
	return finishRestore(dir, intent, backup, say)
}

// FinishRestore completes the restore a kill left unfinished in dir (see the steps above) and
// says its report as Restore would have.
func FinishRestore(dir string, say func(*RestoreReport)) error {
	lock, err := lockDir(dir)
	if err != nil {
		return err
	}
	defer lock.Close()
	intent, err := readRestoreIntent(dir)
	if err != nil {
		return fmt.Errorf("kv: no unfinished restore in %s: %w", dir, err)
	}
	backup, err := ReadBackup(intent.Backup)
	if err != nil {
		return fmt.Errorf("kv: the unfinished restore's backup: %w", err)
	}
	return finishRestore(dir, intent, backup, say)
}

// stageRestore writes backup's records into a new store in staged, closed and synced.
func stageRestore(staged string, lock *os.File, backup *BackupFile) error {
	if err := os.Mkdir(staged, 0o700); err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	db, err := openLocked(staged, lock)
	if err != nil {
		return err
	}
	keys := sortedKeys(backup.Records)
	for len(keys) > 0 {
		batch := keys[:min(len(keys), 256)]
		keys = keys[len(batch):]
		if err := db.Update(context.Background(), func(tx storage.Txn) error {
			for _, k := range batch {
				if err := tx.Set(k, backup.Records[k]); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			db.closeStore()
			return fmt.Errorf("kv: restore: %w", err)
		}
	}
	if err := db.closeStore(); err != nil {
		return fmt.Errorf("kv: restore: %w", err)
	}
	files, err := storeFiles(staged)
	if err != nil {
		return err
	}
	for _, name := range files {
		if err := syncFile(filepath.Join(staged, name)); err != nil {
			return fmt.Errorf("kv: restore: %w", err)
		}
	}
	return SyncDir(staged)
}

// finishRestore moves the replaced store aside and the staged one in, from wherever a kill
// stopped it, says the report, then removes the intent: until the report is said (reading the
// replaced store takes as long as it is big), a kill leaves the restore unfinished, so that the
// next `restore` says what is lost and how to undo it, which a restore run again on the
// restored store cannot (it would find nothing lost, beside another aside).
func finishRestore(dir string, intent restoreIntent, backup *BackupFile, say func(*RestoreReport)) error {
	staged := filepath.Join(dir, restoreStagedName)
	left, err := storeFiles(staged)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	aside := filepath.Join(dir, intent.Aside)
	report := &RestoreReport{Backup: intent.Backup, Taken: intent.Taken, Restored: len(backup.Records), MovedTo: aside}
	if len(left) == len(intent.Staged) {
		// Nothing staged moved in yet: every store file in dir is the replaced store's.
		if err := moveStoreFiles(dir, aside, true); err != nil {
			return err
		}
	}
	if err := moveStoreFiles(staged, dir, false); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Remove(staged); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("kv: restore: %w", err)
	}
	// What the replaced store held, read where it now lies, against the backup.
	current, unreadable, salvageErr := salvage(aside)
	report.Salvaged, report.SalvageErr, report.Unreadable = salvageErr == nil, salvageErr, unreadable
	for _, key := range sortedKeys(current) {
		if value, ok := backup.Records[key]; !ok {
			report.Lost = append(report.Lost, key+": missing from the backup")
		} else if !bytes.Equal(value, current[key]) {
			report.Lost = append(report.Lost, key+": differs in the backup")
		}
	}
	say(report)
	if err := os.Remove(filepath.Join(dir, restoreIntentName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("kv: restore: %w", err)
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("kv: restore: %w", err)
	}
	return nil
}

// writeRestoreIntent writes dir/RESTORING whole: a temporary file, synced, renamed, the
// directory synced.
func writeRestoreIntent(dir string, intent restoreIntent) error {
	data, err := json.Marshal(intent)
	if err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	tmp := filepath.Join(dir, restoreIntentName+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, restoreIntentName))
	}
	if err == nil {
		err = SyncDir(dir)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("kv: write the restore's intent: %w", err)
	}
	return nil
}

// asideName is a directory of dir no other restore used: damaged-<time>, numbered when a clock
// set back repeats a time.
func asideName(dir string) string {
	base := filepath.Join(dir, "damaged-"+time.Now().UTC().Format("20060102T150405Z"))
	aside := base
	for n := 2; ; n++ {
		if _, err := os.Lstat(aside); errors.Is(err, fs.ErrNotExist) {
			return aside
		}
		aside = fmt.Sprintf("%s-%d", base, n)
	}
}

// storeFiles are the names of the store's files in dir, sorted.
func storeFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && (isStoreFile(e.Name()) || e.Name() == "LOCK") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names, nil
}

// moveStoreFiles renames the store's files in from into to (made when missing), then syncs both
// directories.
func moveStoreFiles(from, to string, mkdir bool) error {
	if mkdir {
		if err := os.Mkdir(to, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("kv: %w", err)
		}
	}
	names, err := storeFiles(from)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := os.Rename(filepath.Join(from, name), filepath.Join(to, name)); err != nil {
			return fmt.Errorf("kv: restore: move %s: %w", name, err)
		}
	}
	if err := SyncDir(to); err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	if err := SyncDir(from); err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	return nil
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
