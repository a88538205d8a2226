package kv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
)

// A backup is every key and value of one consistent snapshot, in key order:
//
//	"cockpitfs-backup 1 <unix nanoseconds>\n", then per record uvarint(len key) key
//	uvarint(len value) value, then uvarint(0), then the SHA-256 of everything before it.
//
// The checksum makes a damaged backup refuse to restore instead of restoring damage.
const backupMagic = "cockpitfs-backup 1"

// BackupDirName is where the daemon keeps its rolling backups, inside the data directory.
const BackupDirName = "backups"

// backupsKept is how many rolling backups a data directory keeps: the newest ones.
const backupsKept = 3

// Backup writes every record of one snapshot to path atomically (a temporary file, synced, then
// renamed) and returns how many it wrote. A read that meets damage fails the backup, so a backup
// never holds what the store could not vouch for.
func (db *DB) Backup(path string) (int, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".backup-*")
	if err != nil {
		return 0, fmt.Errorf("kv: backup: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	hash := sha256.New()
	w := bufio.NewWriter(io.MultiWriter(tmp, hash))
	fmt.Fprintf(w, "%s %d\n", backupMagic, time.Now().UnixNano())
	count := 0
	err = db.View(func(tx storage.Txn) error {
		return tx.Scan("", func(key string, value []byte) error {
			count++
			writeField(w, []byte(key))
			writeField(w, value)
			return nil
		})
	})
	if err == nil {
		writeField(w, nil)
		err = w.Flush()
	}
	if err == nil {
		_, err = tmp.Write(hash.Sum(nil))
	}
	if err == nil {
		err = tmp.Sync()
	}
	if closeErr := tmp.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		return 0, fmt.Errorf("kv: backup to %s: %w", path, err)
	}
	return count, nil
}

func writeField(w *bufio.Writer, b []byte) {
	var n [binary.MaxVarintLen64]byte
	w.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
	w.Write(b)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// KeepBackup writes a rolling backup into dir/backups and removes all but the newest few.
func (db *DB) KeepBackup(dir string) (string, int, error) {
	// A damaged table reads as missing records: such a backup would rotate good ones out.
	if err := db.VerifyTables(); err != nil {
		return "", 0, err
	}
	backups := filepath.Join(dir, BackupDirName)
	if err := os.MkdirAll(backups, 0o700); err != nil {
		return "", 0, fmt.Errorf("kv: %w", err)
	}
	path := filepath.Join(backups, time.Now().UTC().Format("20060102T150405.000000000Z")+".backup")
	n, err := db.Backup(path)
	if err != nil {
		return "", 0, err
	}
	names, err := filepath.Glob(filepath.Join(backups, "*.backup"))
	if err != nil {
		return "", 0, fmt.Errorf("kv: %w", err)
	}
	sort.Strings(names) // timestamps sort by time
	for len(names) > backupsKept {
		if err := os.Remove(names[0]); err != nil {
			return "", 0, fmt.Errorf("kv: rotate backups: %w", err)
		}
		names = names[1:]
	}
	return path, n, nil
}

// NewestBackup is the newest rolling backup in dir/backups, or "" when there is none. A directory
// that cannot be listed is an error, not "none": a store another user owns has backups too.
func NewestBackup(dir string) (string, error) {
	backups := filepath.Join(dir, BackupDirName)
	entries, err := os.ReadDir(backups)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("kv: list the backups: %w", err)
	}
	newest := "" // timestamps sort by time
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".backup") && e.Name() > newest {
			newest = e.Name()
		}
	}
	if newest == "" {
		return "", nil
	}
	return filepath.Join(backups, newest), nil
}

// BackupFile is a backup read back and verified against its checksum.
type BackupFile struct {
	Taken   time.Time
	Records map[string][]byte
}

// ReadBackup reads and verifies the backup at path.
func ReadBackup(path string) (*BackupFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("kv: %w", err)
	}
	bad := func(why string) error { return fmt.Errorf("kv: %s is not a usable backup: %s", path, why) }
	if len(data) < sha256.Size {
		return nil, bad("too short")
	}
	body, sum := data[:len(data)-sha256.Size], data[len(data)-sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, bad("its checksum does not match (the file is damaged)")
	}
	line, rest, ok := bytes.Cut(body, []byte("\n"))
	var nanos int64
	if !ok || !strings.HasPrefix(string(line), backupMagic+" ") {
		return nil, bad("no backup header")
	}
	if _, err := fmt.Sscanf(string(line[len(backupMagic)+1:]), "%d", &nanos); err != nil {
		return nil, bad("no backup time")
	}
	b := &BackupFile{Taken: time.Unix(0, nanos), Records: map[string][]byte{}}
	r := bytes.NewReader(rest)
	for {
		key, err := readField(r)
		if err != nil {
			return nil, bad(err.Error())
		}
		if len(key) == 0 {
			break
		}
		value, err := readField(r)
		if err != nil {
			return nil, bad(err.Error())
		}
		b.Records[string(key)] = value
	}
	if r.Len() != 0 {
		return nil, bad("data after its end")
	}
	return b, nil
}

func readField(r *bytes.Reader) ([]byte, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil || n > uint64(r.Len()) {
		return nil, errors.New("a record runs past the end")
	}
	b := make([]byte, n)
	_, err = io.ReadFull(r, b)
	return b, err
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

// Restore replaces the store in dir by the backup at path. The store it replaces is moved, whole
// and unchanged, into dir/damaged-<time>; its readable records are compared with the backup to
// report what is lost. It refuses with *HeldError while a daemon holds dir.
func Restore(dir, path string) (*RestoreReport, error) {
	backup, err := ReadBackup(path)
	if err != nil {
		return nil, err
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	report := &RestoreReport{Backup: path, Taken: backup.Taken, Restored: len(backup.Records)}
	current, unreadable, salvageErr := salvage(dir)
	report.Salvaged, report.SalvageErr, report.Unreadable = salvageErr == nil, salvageErr, unreadable
	for _, key := range sortedKeys(current) {
		if value, ok := backup.Records[key]; !ok {
			report.Lost = append(report.Lost, key+": missing from the backup")
		} else if !bytes.Equal(value, current[key]) {
			report.Lost = append(report.Lost, key+": differs in the backup")
		}
	}
	moved, err := moveStoreAside(dir)
	if err != nil {
		return nil, err
	}
	report.MovedTo = moved
	db, err := openLocked(dir, lock)
	if err != nil {
		return nil, err
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
			return nil, fmt.Errorf("kv: restore: %w", err)
		}
	}
	if err := db.closeStore(); err != nil {
		return nil, fmt.Errorf("kv: restore: %w", err)
	}
	return report, nil
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// moveStoreAside moves badger's files into a new dir/damaged-<time> and returns its path.
func moveStoreAside(dir string) (string, error) {
	aside := filepath.Join(dir, "damaged-"+time.Now().UTC().Format("20060102T150405Z"))
	if err := os.Mkdir(aside, 0o700); err != nil {
		return "", fmt.Errorf("kv: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("kv: %w", err)
	}
	for _, e := range entries {
		if e.Type().IsRegular() && (isStoreFile(e.Name()) || e.Name() == "LOCK") {
			if err := os.Rename(filepath.Join(dir, e.Name()), filepath.Join(aside, e.Name())); err != nil {
				return "", fmt.Errorf("kv: move the store aside: %w", err)
			}
		}
	}
	if err := syncDir(dir); err != nil {
		return "", fmt.Errorf("kv: %w", err)
	}
	return aside, nil
}
