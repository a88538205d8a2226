package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/badger/v4/y"
	"github.com/dgraph-io/ristretto/v2/z"
	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/storage"
)

// CorruptError names a store file damaged in a way badger would repair by discarding data: it
// treats a bad log entry as a torn tail and drops every entry after it, starts an empty store and
// deletes every table when MANIFEST is missing, skips a table whose checksum fails, and panics on
// a truncated one. Open refuses such a store before badger touches it.
type CorruptError struct {
	Dir     string
	File    string // the damaged file's path
	Problem string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("%s: %s", e.File, e.Problem)
}

func (e *CorruptError) Unwrap() error { return storage.ErrCorrupt }

const manifestName = "MANIFEST"

// badger's log layout (memtable.go, structs.go): a 20-byte header of key id and IV, then entries
// of a varint header, key, value and a big-endian CRC-32C of the three.
const (
	logHeaderSize   = 20
	maxEntryHeader  = 22
	maxKeyLength    = 1 << 16
	badgerTsLength  = 8 // every key in a log ends with its version
	crcLength       = 4
	inspectionChunk = 64 << 10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Inspect checks the store in dir without changing it: MANIFEST present and readable whenever
// the store holds anything, every table it names present with valid checksums, no write-ahead
// log record damaged where a later record shows it was durable, and no badger log with a valid
// entry the last checkpoint made durable after a bad one (a torn tail, a bad entry followed by
// nothing, or by entries only the write-ahead log vouches for, is what a crash leaves and is
// fine). It returns a *CorruptError for the first damage found, and an *UnfinishedRestoreError
// for a directory a killed restore left half replaced.
func Inspect(dir string) error {
	if err := UnfinishedRestore(dir); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	var tables, logs []string
	segments := 0
	hasManifest := false
	for _, e := range entries {
		name := e.Name()
		switch {
		case name == manifestName:
			hasManifest = true
		case strings.HasSuffix(name, ".sst"):
			tables = append(tables, name)
		case strings.HasSuffix(name, ".mem") || strings.HasSuffix(name, ".vlog"):
			logs = append(logs, name)
		case strings.HasSuffix(name, segmentExt):
			segments++
		}
	}
	sort.Strings(logs)
	if !hasManifest {
		if len(tables)+len(logs)+segments == 0 {
			return nil // a new store
		}
		return &CorruptError{Dir: dir, File: filepath.Join(dir, manifestName), Problem: fmt.Sprintf(
			"missing, while the store holds %d tables and %d logs (badger would start an empty store and delete them)",
			len(tables), len(logs)+segments)}
	}
	if err := inspectTables(dir, tables); err != nil {
		return err
	}
	scan, err := scanLog(dir)
	if err != nil {
		return err
	}
	// Without a checkpoint logged, badger's logs are the only copy (a store written before the
	// write-ahead log, which synced them at every commit): every entry counts.
	durable := uint64(math.MaxUint64)
	if len(scan.records) > 0 {
		durable = scan.checkpoint
	}
	for _, name := range logs {
		if err := inspectLog(dir, name, durable); err != nil {
			return err
		}
	}
	return nil
}

func inspectTables(dir string, present []string) error {
	manifestPath := filepath.Join(dir, manifestName)
	f, err := os.Open(manifestPath)
	if err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	manifest, end, err := replayManifest(f)
	if err != nil {
		return &CorruptError{Dir: dir, File: manifestPath, Problem: "unreadable: " + err.Error()}
	}
	named := map[string]bool{}
	for id, tm := range manifest.Tables {
		path := table.NewFilename(id, dir)
		named[filepath.Base(path)] = true
		if err := inspectTable(path, tm.Compression); err != nil {
			return &CorruptError{Dir: dir, File: path, Problem: err.Error()}
		}
	}
	// A crash during compaction leaves tables MANIFEST does not name yet, or no longer, which
	// badger deletes. A MANIFEST cut short leaves such tables too, holding live data.
	if end < info.Size() {
		for _, name := range present {
			if !named[name] {
				return &CorruptError{Dir: dir, File: manifestPath, Problem: fmt.Sprintf(
					"ends in a partial entry at byte %d of %d while table %s is not named in it (badger would delete the table)",
					end, info.Size(), name)}
			}
		}
	}
	return nil
}

// replayManifest is badger's own reader, kept from panicking on a damaged file.
func replayManifest(f *os.File) (m badger.Manifest, end int64, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	return badger.ReplayManifestFile(f, 0, badger.DefaultOptions(""))
}

// inspectTable opens the table read-only and verifies every block's checksum. badger panics on
// some truncations; that is damage too.
func inspectTable(path string, compression options.CompressionType) (err error) {
	mf, err := z.OpenMmapFile(path, os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return errors.New("missing, though MANIFEST names it")
	}
	if err != nil {
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			mf.Close(-1)
			err = fmt.Errorf("unreadable: %s", oneLine(p))
		}
	}()
	t, err := table.OpenTable(mf, table.Options{ChkMode: options.OnTableRead, Compression: compression, ReadOnly: true})
	if err != nil {
		return fmt.Errorf("fails its checksum: %w", err)
	}
	// Close, not DecrRef: the last reference's DecrRef deletes the file.
	return t.Close(-1)
}

// inspectLog refuses a log in which a valid entry of a version up to durable (synced by a
// checkpoint) follows one that is not: badger would stop at the bad entry and drop everything
// after it, acknowledged commits the write-ahead log no longer holds included. Entries of later
// versions were never synced here, and a power cut may have kept any of them: the write-ahead log
// has those it acknowledged.
func inspectLog(dir, name string, durable uint64) error {
	path := filepath.Join(dir, name)
	log, err := loadLog(path)
	if err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	defer log.close()
	data := log.data
	if len(data) < logHeaderSize {
		return nil
	}
	off := logHeaderSize
	for off < len(data) {
		n, ok := entryAt(data, off)
		if !ok {
			break
		}
		off += n
	}
	if off >= len(data) {
		return nil
	}
	for p := log.nextCandidate(off + 1); p < len(data); p = log.nextCandidate(p + 1) {
		if n, ok := entryAt(data, p); ok && (!strings.HasSuffix(name, ".mem") || y.ParseTs(decodeEntry(data[p:p+n]).key) <= durable) {
			return &CorruptError{Dir: dir, File: path, Problem: fmt.Sprintf(
				"bad entry at byte %d followed by valid entries from byte %d (not a torn tail: badger would drop them)", off, p)}
		}
	}
	return nil
}

// loadedLog is a log read into memory, its holes (most of a log is a zeroed tail) left unread
// and skipped by asking the file system where data is. Not a memory map: on a full tmpfs even a
// read through a map of a hole is SIGBUS.
type loadedLog struct {
	data []byte
	file *os.File
}

func loadLog(path string) (*loadedLog, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	l := &loadedLog{data: make([]byte, info.Size()), file: f}
	for off := int64(0); off < info.Size(); {
		start, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // the rest is a hole
		}
		if err != nil { // no hole support: read it all
			start = off
		}
		end, err := unix.Seek(int(f.Fd()), start, unix.SEEK_HOLE)
		if err != nil {
			end = info.Size()
		}
		if _, err := f.ReadAt(l.data[start:end], start); err != nil && !errors.Is(err, io.EOF) {
			f.Close()
			return nil, err
		}
		off = end
	}
	return l, nil
}

func (l *loadedLog) close() { l.file.Close() }

// nextCandidate is the first offset from from where an entry could start: its key length, the
// third byte, is never zero.
func (l *loadedLog) nextCandidate(from int) int {
	data := l.data
	at := from + 2
	for at < len(data) {
		end := min(at+len(zeroPage), len(data))
		if bytes.Equal(data[at:end], zeroPage[:end-at]) {
			next, err := unix.Seek(int(l.file.Fd()), int64(end), unix.SEEK_DATA)
			switch {
			case errors.Is(err, unix.ENXIO): // nothing but a hole left
				return len(data)
			case err == nil && int(next) > end:
				at = int(next)
			default:
				at = end
			}
			continue
		}
		for ; at < end; at++ {
			if data[at] != 0 {
				return at - 2
			}
		}
	}
	return len(data)
}

var zeroPage [4096]byte

// entryAt returns the length of the valid entry at off: a plausible header and a matching CRC.
func entryAt(data []byte, off int) (int, bool) {
	if off+2 >= len(data) {
		return 0, false
	}
	header := data[off+2 : min(off+maxEntryHeader, len(data))]
	klen, n1 := binary.Uvarint(header)
	if n1 <= 0 || klen < badgerTsLength || klen > maxKeyLength {
		return 0, false
	}
	vlen, n2 := binary.Uvarint(header[n1:])
	if n2 <= 0 {
		return 0, false
	}
	_, n3 := binary.Uvarint(header[n1+n2:])
	if n3 <= 0 {
		return 0, false
	}
	body := off + 2 + n1 + n2 + n3 + int(klen)
	if vlen > uint64(len(data)) || body+int(vlen)+crcLength > len(data) {
		return 0, false
	}
	end := body + int(vlen)
	if crc32.Checksum(data[off:end], castagnoli) != binary.BigEndian.Uint32(data[end:end+crcLength]) {
		return 0, false
	}
	return end + crcLength - off, true
}

// copyForInspection copies the store's files into a new temporary directory, holes left as
// holes, so badger can replay and flush there while dir stays exactly as it is. (Hard links will
// not do: badger truncates a table before deleting it.)
func copyForInspection(dir string) (string, error) {
	removeDeadInspections()
	tmp, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", inspectPrefix, os.Getpid()))
	if err != nil {
		return "", fmt.Errorf("kv: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("kv: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || name == lockFileName || name == "LOCK" || !isStoreFile(name) {
			continue
		}
		if err := copySparse(filepath.Join(dir, name), filepath.Join(tmp, name)); err != nil {
			os.RemoveAll(tmp)
			return "", fmt.Errorf("kv: copy %s for inspection: %w", name, err)
		}
	}
	return tmp, nil
}

// inspectPrefix names the copies copyForInspection makes: the prefix, the pid of the process that
// made it, a dash.
const inspectPrefix = "cockpitfs-inspect-"

// removeDeadInspections removes the copies of processes that are gone (a verify killed before it
// removed its own). A copy whose pid is alive, whoever now has that pid, stays.
func removeDeadInspections() {
	copies, _ := filepath.Glob(filepath.Join(os.TempDir(), inspectPrefix+"*"))
	for _, c := range copies {
		pid, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(c), inspectPrefix), "-")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n <= 0 {
			continue
		}
		if unix.Kill(n, 0) == unix.ESRCH {
			os.RemoveAll(c)
		}
	}
}

// isStoreFile reports whether name is one of the store's files: badger's and the write-ahead
// log's (not our lock or backups).
func isStoreFile(name string) bool {
	for _, suffix := range []string{".sst", ".mem", ".vlog", segmentExt} {
		if strings.HasSuffix(name, suffix) {
			return true
		}
	}
	return name == manifestName || name == "KEYREGISTRY" || name == "DISCARD"
}

func copySparse(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, inspectionChunk)
	var size int64
	for {
		n, rerr := io.ReadFull(src, buf)
		if n > 0 {
			if allZero(buf[:n]) {
				_, err = dst.Seek(int64(n), io.SeekCurrent)
			} else {
				_, err = dst.Write(buf[:n])
			}
			if err != nil {
				dst.Close()
				return err
			}
			size += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			dst.Close()
			return rerr
		}
	}
	if err := dst.Truncate(size); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// oneLine flattens a recovered panic, which badger may make several lines long, for a message.
func oneLine(p any) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(fmt.Sprint(p), "==", "")), " ")
}
