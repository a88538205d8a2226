package main

import (
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/cockpitfs/cockpitfs/internal/shell"
	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
)

// backupEvery is how often a serving daemon refreshes its rolling backup, when anything changed.
const backupEvery = 10 * time.Minute

// backupCommand writes a backup of a stopped daemon's store to FILE.
func backupCommand(args []string) error {
	fset := newFlags("backup")
	data := dataFlag(fset)
	positional, err := parseInterspersed(fset, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return &usageError{command: "backup", msg: "backup takes one FILE"}
	}
	db, err := openOffline(*data)
	if err != nil {
		return err
	}
	defer db.Close()
	// Numbered after the store's rolling backups: copied among them, it is the newest.
	seq, err := kv.NextBackupSeq(*data)
	if err != nil {
		return err
	}
	n, err := db.Backup(positional[0], seq)
	if err != nil {
		return err
	}
	fmt.Printf("%s backed up to %s (backup %d of %s)\n", plural(n, "record"), positional[0], seq, *data)
	return nil
}

// restoreCommand replaces a stopped daemon's store by a backup (default: the newest rolling
// one), keeping the replaced store aside, and says what is lost.
func restoreCommand(args []string) error {
	fset := newFlags("restore")
	data := dataFlag(fset)
	positional, err := parseInterspersed(fset, args)
	if err != nil {
		return err
	}
	if len(positional) > 1 {
		return &usageError{command: "restore", msg: "restore takes at most one FILE"}
	}
	// restore writes the whole store there: only into a directory no other user controls, as a
	// daemon (verify and backup only read it: root may check a user's store).
	if err := checkDataDir(*data); err != nil {
		return err
	}
	var unfinished *kv.UnfinishedRestoreError
	if errors.As(kv.UnfinishedRestore(*data), &unfinished) {
		// A killed restore is finished, never started over: the store it replaced lies aside.
		if len(positional) == 1 && positional[0] != unfinished.Backup {
			return fmt.Errorf("%w; finish it first with `cockpitfs restore --data %s`, then restore %s", unfinished, *data, positional[0])
		}
		return heldHint(kv.FinishRestore(*data, func(report *kv.RestoreReport) {
			fmt.Printf("finished the restore of %s that was stopped before it ended\n", report.Backup)
			printRestore(report, *data)
		}))
	}
	var path string
	if len(positional) == 1 {
		path = positional[0]
	} else {
		if path, err = kv.NewestBackup(*data); err != nil {
			return err
		}
		if path == "" {
			return fmt.Errorf("no backup in %s/%s: name a backup file (cockpitfs restore --data %s FILE)", *data, kv.BackupDirName, *data)
		}
	}
	// Said before the restore ends: killed before then, it is unfinished, and finishing it says
	// it again (what is lost, and how to undo it).
	return heldHint(kv.Restore(*data, path, func(report *kv.RestoreReport) { printRestore(report, *data) }))
}

// printRestore says what a restore of data did, what is lost, and how to undo it when anything
// is: restore asks nothing, and run on a clean store it drops what was committed since the backup.
func printRestore(report *kv.RestoreReport, data string) {
	fmt.Printf("restored %s from %s (taken %s)\n", plural(report.Restored, "record"), report.Backup, report.Taken.Format(time.RFC3339))
	fmt.Printf("the replaced store is kept, unchanged, in %s\n", report.MovedTo)
	for _, f := range report.Unreadable {
		fmt.Printf("could not be read in full, what only it held is lost: %s\n", f)
	}
	switch {
	case !report.Salvaged:
		fmt.Printf("the replaced store could not be read (%v): whatever was committed after %s is lost\n",
			report.SalvageErr, report.Taken.Format(time.RFC3339))
	case len(report.Lost) == 0:
		fmt.Println("lost: nothing else the replaced store could still read")
	default:
		fmt.Printf("lost: %s of the replaced store, which the backup holds otherwise or not at all:\n", plural(len(report.Lost), "record"))
		for _, l := range report.Lost {
			fmt.Println("  " + l)
		}
		fmt.Printf("to undo it: cockpitfs backup --data %s FILE && cockpitfs restore --data %s FILE\n", shell.Quote(report.MovedTo), shell.Quote(data))
	}
}

// openOffline opens a stopped daemon's store read-only, saying what to do when it is damaged or
// in use.
func openOffline(data string) (*kv.DB, error) {
	if err := isStore(data); err != nil {
		return nil, err
	}

	if err := unfinishedMigration(data); err != nil {
		return nil, err
	}
	db, err := kv.OpenReadOnly(data)
	if err != nil {
		return nil, heldHint(damageHint(err, data))
	}
	return db, nil
}

// damageHint adds the way out to a refusal to open a damaged store, or one a killed restore left
// half replaced.
func damageHint(err error, data string) error {
	var unfinished *kv.UnfinishedRestoreError
	if errors.As(err, &unfinished) {
		return fmt.Errorf("%w; nothing was changed: finish the restore with `cockpitfs restore --data %s`", err, data)
	}
	var corrupt *kv.CorruptError
	if !errors.As(err, &corrupt) {
		return err
	}
	newest, _ := kv.NewestBackup(data)
	way := fmt.Sprintf("restore a backup with `cockpitfs restore --data %s FILE`", data)
	if newest != "" {
		way = fmt.Sprintf("restore the newest backup (%s) with `cockpitfs restore --data %s`, which keeps the damaged store aside and reports what is lost", newest, data)
	}
	return fmt.Errorf("the store is damaged, nothing was changed: %w; way out: %s", err, way)
}

// heldHint says how to reach a store a running daemon holds.
func heldHint(err error) error {
	var held *kv.HeldError
	if errors.As(err, &held) {
		return fmt.Errorf("%w: stop it first (cockpitfs unmount); it keeps rolling backups in %s/%s", err, held.Dir, kv.BackupDirName)
	}
	return err
}

// keepBackups refreshes the daemon's rolling backup at start and then every backupEvery when the
// store changed, until stop is closed. A failed backup is logged and leaves the previous ones.
func keepBackups(db *kv.DB, data string, stop <-chan struct{}) {
	backup := func() {
		r, err := db.KeepBackup(data)
		if errors.Is(err, storage.ErrCorrupt) {
			log.Printf("the store is damaged, every operation now answers EIO; stop the daemon, then `cockpitfs verify --data %s` and `cockpitfs restore --data %s`: %v", data, data, err)
			return
		}
		if r.Path != "" {
			log.Printf("backup: %s in %s (backup %d)", plural(r.Records, "record"), r.Path, r.Seq)
		}
		for _, removed := range r.Removed {
			log.Printf("backup: removed %s, older than the newest %d", removed, kv.BackupsKept)
		}
		if r.Kept != "" {
			log.Printf("backup: kept %s (%s) beside the newest %d, which hold fewer: restore it with `cockpitfs restore --data %s %s`, or remove it once it is not needed",
				r.Kept, plural(r.KeptRecords, "record"), kv.BackupsKept, data, r.Kept)
		}
		if err != nil {
			log.Printf("backup: %v", err)
		}
	}
	backup()
	ticker := time.NewTicker(backupEvery)
	defer ticker.Stop()
	last := db.Syncs()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
			if now := db.Syncs(); now != last {
				last = now
				backup()
			}
		}
	}
}
