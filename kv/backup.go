package kv

import (
	"bufio"
	"bytes"
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

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/storage"
)

// A backup is every key and value of one consistent snapshot, in key order:
//
//	"cockpitfs-backup 2 <unix nanoseconds> seq=<n> records=<n>\n", then per record uvarint(len
//	key) key uvarint(len value) value, then uvarint(0), then the SHA-256 of everything before it.
//
// The checksum makes a damaged backup refuse to restore instead of restoring damage. seq orders
// the backups of one data directory: each is one past the highest its backups directory held
// when it was written, so the order is what they hold, whatever their names or the clock said.
// A version 1 backup ("cockpitfs-backup 1 <unix nanoseconds>\n") has seq 0.
const (
	backupMagic   = "cockpitfs-backup"
	backupVersion = 2
)

// BackupDirName is where the daemon keeps its rolling backups, inside the data directory.
const BackupDirName = "backups"

// BackupsKept is how many rolling backups a data directory keeps: the newest ones.
const BackupsKept = 3

// Backup writes every record of one snapshot to path atomically (a temporary file, synced, then
// renamed) as backup number seq, and returns how many records it wrote. A read that meets damage
// fails the backup, so a backup never holds what the store could not vouch for.
func (db *DB) Backup(path string, seq uint64) (int, error) {
	var keys []string
	var values [][]byte
	err := db.View(func(tx storage.Txn) error {
		return tx.Scan("", func(key string, value []byte) error {
			keys, values = append(keys, key), append(values, bytes.Clone(value))
			return nil
		})
	})
	if err != nil {
		return 0, fmt.Errorf("kv: backup to %s: %w", path, err)
	}
	tmp, publish, discard, err := newBackupFile(path)
	if err != nil {
		return 0, fmt.Errorf("kv: backup: %w", err)
	}
	defer discard()
	hash := sha256.New()
	w := bufio.NewWriter(io.MultiWriter(tmp, hash))
	fmt.Fprintf(w, "%s %d %d seq=%d records=%d\n", backupMagic, backupVersion, time.Now().UnixNano(), seq, len(keys))
	for i, key := range keys {
		writeField(w, []byte(key))
		writeField(w, values[i])
	}
	writeField(w, nil)
	err = w.Flush()
	if err == nil {
		_, err = tmp.Write(hash.Sum(nil))
	}
	if err == nil {
		err = tmp.Sync()
	}
	if err == nil {
		err = publish()
	}
	if closeErr := tmp.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		err = SyncDir(filepath.Dir(path))
	}
	if err != nil {
		return 0, fmt.Errorf("kv: backup to %s: %w", path, err)
	}
	return len(keys), nil
}

// backupTempPrefix names a backup being written; one a killed writer left in a backups directory
// is removed by the next rolling backup.
const backupTempPrefix = ".backup-"

// newBackupFile is the file a backup to path is written to, and what gives it path once it is
// whole and synced. Where the file system has them (ext4, xfs, btrfs, tmpfs), the file has no name
// until then (O_TMPFILE): a writer killed before leaves nothing beside path, and one killed after
// leaves path whole, or, when path was there already, a temporary name of the whole backup for the
// moment between its link and its rename over path (linkat cannot replace). Elsewhere (or without
// /proc, whose link to the descriptor names it) it is a temporary name from the start, removed on
// failure, left by a kill.
func newBackupFile(path string) (f *os.File, publish func() error, discard func(), err error) {
	dir := filepath.Dir(path)
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if _, perr := os.Stat("/proc/self/fd"); err == nil && perr != nil {
		unix.Close(fd) // no name to link it by
		err = perr
	}
	if err == nil {
		f := os.NewFile(uintptr(fd), path)
		name := fmt.Sprintf("/proc/self/fd/%d", fd)
		return f, func() error {
			err := unix.Linkat(unix.AT_FDCWD, name, unix.AT_FDCWD, path, unix.AT_SYMLINK_FOLLOW)
			if !errors.Is(err, unix.EEXIST) {
				return err
			}
			// path is there: a name of its own first, then renamed over path.
			tmp := filepath.Join(dir, fmt.Sprintf("%s%d", backupTempPrefix, time.Now().UnixNano()))
			if err := unix.Linkat(unix.AT_FDCWD, name, unix.AT_FDCWD, tmp, unix.AT_SYMLINK_FOLLOW); err != nil {
				return err
			}
			if err := os.Rename(tmp, path); err != nil {
				os.Remove(tmp)
				return err
			}
			return nil
		}, func() { f.Close() }, nil
	}
	f, err = os.CreateTemp(dir, backupTempPrefix+"*")
	if err != nil {
		return nil, nil, nil, err
	}
	return f, func() error { return os.Rename(f.Name(), path) },
		func() { f.Close(); os.Remove(f.Name()) }, nil // the Remove fails harmlessly once renamed
}

func writeField(w *bufio.Writer, b []byte) {
	var n [binary.MaxVarintLen64]byte
	w.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
	w.Write(b)
}

// SyncDir makes dir's entries durable: a file created, renamed or removed in it survives a
// crash once its directory is synced.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Rotation is what a rolling backup did.
type Rotation struct {
	Path    string
	Seq     uint64
	Records int
	Removed []string // the backups rotated out
	// Kept is a backup older than the newest few, kept because it holds more records than any
	// of them (a store emptied by mistake does not push its last good backups out), "" when none.
	Kept        string
	KeptRecords int
}

// KeepBackup writes a rolling backup into dir/backups and removes all but the newest few (by
// sequence, see Backup), keeping also the older backup holding the most records when it holds
// more than any of them.
func (db *DB) KeepBackup(dir string) (Rotation, error) {
	// A damaged table reads as missing records: such a backup would rotate good ones out.
	if err := db.VerifyTables(); err != nil {
		return Rotation{}, err
	}
	backups := filepath.Join(dir, BackupDirName)
	if err := os.MkdirAll(backups, 0o700); err != nil {
		return Rotation{}, fmt.Errorf("kv: %w", err)
	}
	removeStaleTemps(backups)
	seq, err := NextBackupSeq(dir)
	if err != nil {
		return Rotation{}, err
	}
	// The name is for people; nothing orders by it. A clock set back may repeat one.
	name := time.Now().UTC().Format("20060102T150405.000000000Z")
	path := filepath.Join(backups, name+".backup")
	if _, err := os.Lstat(path); err == nil {
		path = filepath.Join(backups, fmt.Sprintf("%s-%d.backup", name, seq))
	}
	n, err := db.Backup(path, seq)
	if err != nil {
		return Rotation{}, err
	}
	r := Rotation{Path: path, Seq: seq, Records: n}
	list, err := listBackups(backups)
	if err != nil {
		return r, err
	}
	newest := list[max(0, len(list)-BackupsKept):]
	most := 0
	for _, b := range newest {
		most = max(most, b.records)
	}
	older := list[:max(0, len(list)-BackupsKept)]
	keep := -1
	for i, b := range older {
		if b.records > most && (keep < 0 || b.records >= older[keep].records) {
			keep = i
		}
	}
	for i, b := range older {
		if i == keep {
			r.Kept, r.KeptRecords = b.path, b.records
			continue
		}
		if err := os.Remove(b.path); err != nil {
			return r, fmt.Errorf("kv: rotate backups: %w", err)
		}
		r.Removed = append(r.Removed, b.path)
	}
	return r, nil
}

// removeStaleTemps removes the temporary files of backups whose writer died: the caller holds
// the data directory, so no other writer is alive.
func removeStaleTemps(backups string) {
	temps, _ := filepath.Glob(filepath.Join(backups, backupTempPrefix+"*"))
	for _, t := range temps {
		os.Remove(t)
	}
}

// listedBackup is a backup as its header describes it.
type listedBackup struct {
	path    string
	seq     uint64
	taken   time.Time
	records int
}

// listBackups lists the backups in dir, oldest first: by sequence; backups of version 1 (seq 0)
// by the time they say they were taken, the only order they carry. A file whose header cannot
// be read is not a backup. A directory that cannot be listed is an error.
func listBackups(dir string) ([]listedBackup, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kv: list the backups: %w", err)
	}
	var list []listedBackup
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".backup") || !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		h, err := readBackupHeader(path)
		if err != nil {
			continue
		}
		list = append(list, h)
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].seq != list[j].seq {
			return list[i].seq < list[j].seq
		}
		return list[i].taken.Before(list[j].taken)
	})
	return list, nil
}

// NextBackupSeq is the sequence number of dir's next backup: one past the highest in
// dir/backups.
func NextBackupSeq(dir string) (uint64, error) {
	list, err := listBackups(filepath.Join(dir, BackupDirName))
	if err != nil || len(list) == 0 {
		return 1, err
	}
	return list[len(list)-1].seq + 1, nil
}

// NewestBackup is the rolling backup in dir/backups holding the newest content (the highest
// sequence), or "" when there is none. A directory that cannot be listed is an error, not
// "none": a store another user owns has backups too.
func NewestBackup(dir string) (string, error) {
	list, err := listBackups(filepath.Join(dir, BackupDirName))
	if err != nil || len(list) == 0 {
		return "", err
	}
	return list[len(list)-1].path, nil
}

// readBackupHeader reads the first line of the backup at path.
func readBackupHeader(path string) (listedBackup, error) {
	f, err := os.Open(path)
	if err != nil {
		return listedBackup{}, err
	}
	defer f.Close()
	line, err := bufio.NewReader(io.LimitReader(f, 256)).ReadString('\n')
	if err != nil {
		return listedBackup{}, errors.New("no backup header")
	}
	return parseBackupHeader(path, strings.TrimSuffix(line, "\n"))
}

// parseBackupHeader reads a backup's first line, without its newline.
func parseBackupHeader(path, line string) (listedBackup, error) {
	b := listedBackup{path: path, records: -1}
	var nanos int64
	if _, err := fmt.Sscanf(line, backupMagic+" 1 %d", &nanos); err == nil && !strings.Contains(line, "seq=") {
		b.taken = time.Unix(0, nanos)
		return b, nil
	}
	if _, err := fmt.Sscanf(line, backupMagic+" 2 %d seq=%d records=%d", &nanos, &b.seq, &b.records); err != nil {
		return listedBackup{}, errors.New("no backup header")
	}
	b.taken = time.Unix(0, nanos)
	return b, nil
}

// BackupFile is a backup read back and verified against its checksum.
type BackupFile struct {
	Taken   time.Time
	Seq     uint64 // 0 for a version 1 backup
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
	if !ok {
		return nil, bad("no backup header")
	}
	header, err := parseBackupHeader(path, string(line))
	if err != nil {
		return nil, bad(err.Error())
	}
	b := &BackupFile{Taken: header.taken, Seq: header.seq, Records: map[string][]byte{}}
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
	if header.records >= 0 && header.records != len(b.Records) {
		return nil, bad(fmt.Sprintf("it holds %d records where its header says %d", len(b.Records), header.records))
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
