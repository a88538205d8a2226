package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The write-ahead log is the store's durable truth; badger, unsynced, is its materialised state.
// Each commit is one record pwritten into a preallocated, zero-filled segment and made durable by
// an fdatasync of that segment (see durable.go); badger's own files are synced only at a
// checkpoint, and Open replays every record after the last one.
//
// A segment is segmentSize bytes named by its index (000001.wal …), written once with zeros and
// synced before it takes a record, so that a record's fdatasync writes its data pages and nothing
// else: no size change, no block to allocate, no unwritten extent to convert. (A write into a
// page of a memory-mapped file, as badger's own log is, would have to be write-protected on every
// CPU before its sync; write(2) needs none of that.)
//
// A record is
//
//	length uint32 | CRC-32C of body uint32 | body
//	body: ts uint64 | synced uint64 | kind byte | payload
//
// little-endian, where ts is the commit's badger version (records are numbered consecutively
// within a segment), synced the highest ts known durable when the record was written (how Open
// tells a torn tail from damage), and the payload either a commit's writes (uvarint count, then
// per write an op byte, uvarint key length, key and, for a set, uvarint value length and value)
// or a checkpoint (uint64: every commit up to it is durable in badger's own files). A record
// under a page never straddles a page boundary: it starts on the next page instead, the rest of
// the page left zero, so its sync writes one page.
const (
	segmentSize  = 2 << 20
	pageSize     = 4096
	recordHeader = 8
	bodyHeader   = 17
	segmentExt   = ".wal"
)

const (
	kindCommit     = 1
	kindCheckpoint = 2
	opSet          = 1
	opDelete       = 2
)

// write is one set or delete of a commit.
type write struct {
	key    string
	value  []byte
	delete bool
}

// record is a decoded log record.
type record struct {
	ts, synced uint64
	kind       byte
	writes     []write
	checkpoint uint64
}

// appendRecord encodes a record onto buf.
func appendRecord(buf []byte, r *record) []byte {
	start := len(buf)
	buf = append(buf, make([]byte, recordHeader)...)
	buf = binary.LittleEndian.AppendUint64(buf, r.ts)
	buf = binary.LittleEndian.AppendUint64(buf, r.synced)
	buf = append(buf, r.kind)
	switch r.kind {
	case kindCommit:
		buf = binary.AppendUvarint(buf, uint64(len(r.writes)))
		for _, w := range r.writes {
			op := byte(opSet)
			if w.delete {
				op = opDelete
			}
			buf = append(buf, op)
			buf = binary.AppendUvarint(buf, uint64(len(w.key)))
			buf = append(buf, w.key...)
			if !w.delete {
				buf = binary.AppendUvarint(buf, uint64(len(w.value)))
				buf = append(buf, w.value...)
			}
		}
	case kindCheckpoint:
		buf = binary.LittleEndian.AppendUint64(buf, r.checkpoint)
	}
	body := buf[start+recordHeader:]
	binary.LittleEndian.PutUint32(buf[start:], uint32(len(body)))
	binary.LittleEndian.PutUint32(buf[start+4:], crc32.Checksum(body, castagnoli))
	return buf
}

// recordAt returns the valid record at off and its length, or false: a length that fits, a
// matching CRC and a body that decodes.
func recordAt(data []byte, off int) (*record, int, bool) {
	if off+recordHeader+bodyHeader > len(data) {
		return nil, 0, false
	}
	n := int(binary.LittleEndian.Uint32(data[off:]))
	if n < bodyHeader || n > len(data)-off-recordHeader {
		return nil, 0, false
	}
	body := data[off+recordHeader : off+recordHeader+n]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(data[off+4:]) {
		return nil, 0, false
	}
	r, ok := decodeBody(body)
	return r, recordHeader + n, ok
}

func decodeBody(body []byte) (*record, bool) {
	r := &record{ts: binary.LittleEndian.Uint64(body), synced: binary.LittleEndian.Uint64(body[8:]), kind: body[16]}
	p := body[bodyHeader:]
	uvarint := func() (uint64, bool) {
		v, k := binary.Uvarint(p)
		if k <= 0 {
			return 0, false
		}
		p = p[k:]
		return v, true
	}
	bytesOf := func() ([]byte, bool) {
		n, ok := uvarint()
		if !ok || n > uint64(len(p)) {
			return nil, false
		}
		b := p[:n:n]
		p = p[n:]
		return b, true
	}
	switch r.kind {
	case kindCommit:
		count, ok := uvarint()
		if !ok || count > uint64(len(p)) {
			return nil, false
		}
		r.writes = make([]write, 0, count)
		for range count {
			if len(p) == 0 {
				return nil, false
			}
			op := p[0]
			p = p[1:]
			key, ok := bytesOf()
			if !ok || (op != opSet && op != opDelete) {
				return nil, false
			}
			w := write{key: string(key), delete: op == opDelete}
			if !w.delete {
				if w.value, ok = bytesOf(); !ok {
					return nil, false
				}
			}
			r.writes = append(r.writes, w)
		}
	case kindCheckpoint:
		if len(p) != 8 {
			return nil, false
		}
		r.checkpoint = binary.LittleEndian.Uint64(p)
		p = nil
	default:
		return nil, false
	}
	return r, len(p) == 0
}

// placeRecord is where a record of n bytes goes in a segment whose first free byte is off: off if
// it fits in the rest of off's page, else the next page's start (so a record under a page never
// straddles two, and any record not at a page's start fits in its page). -1: it does not fit.
func placeRecord(off, n int) int {
	if off%pageSize != 0 && off%pageSize+n > pageSize {
		off = (off/pageSize + 1) * pageSize
	}
	if off+n > segmentSize {
		return -1
	}
	return off
}

// recordStart is where the record after one ending at off begins, as placeRecord put it: off, or
// the next page's start when the rest of off's page is too short for a record or begins with a
// zero length; -1 when no record begins there (zeros), the end of the segment's records.
func recordStart(data []byte, off int) int {
	if rest := pageSize - off%pageSize; rest != pageSize && (rest < recordHeader+bodyHeader ||
		off+4 > len(data) || binary.LittleEndian.Uint32(data[off:]) == 0) {
		off += rest
	}
	if off+4 > len(data) || binary.LittleEndian.Uint32(data[off:]) == 0 {
		return -1
	}
	return off
}

// segment is one log file. Records are copied into win when sequenced; the next sync round
// writes the pages they are on, whole, with O_DIRECT, and fdatasyncs the file. (A record
// pwritten into the page cache and then fdatasync'd cost 6–17 % more than one page written
// directly and fdatasync'd, measured side by side: writeback of a page-cache page on ext4 is the
// slower path, and the data I/O is the same.)
type segment struct {
	index uint64
	file  *os.File // opened with O_DIRECT where the file system allows it
	// direct says file is; flush is what a round fdatasyncs for it (flush.go), nil for file.
	direct bool
	flush  *os.File
	off    int    // first free byte
	last   uint64 // ts of its last record, 0 while none
	// win is the segment from winOff (a page boundary) to the end of its last record, in an
	// aligned buffer whose bytes beyond off are zero; written is off as of the last round, and
	// unwrittenFrom where the first record since then begins.
	win           []byte
	winOff        int
	written       int
	unwrittenFrom int
}

// put copies a record into the window at off, where placeRecord put it.
func (s *segment) put(rec []byte, off int) {
	if s.off == s.written {
		s.unwrittenFrom = off
	}
	need := off + len(rec) - s.winOff
	if need > len(s.win) {
		grown := alignedPages(max(need, 2*len(s.win)))
		copy(grown, s.win)
		s.win = grown
	}
	copy(s.win[off-s.winOff:], rec)
	s.off = off + len(rec)
}

// take copies the pages written to since the last round onto buf (aligned, its capacity reused
// from round to round so that no page is newly allocated, or faulted in, on a commit's path),
// and keeps in the window only the last page, which later records may share. The window's first
// page goes again only if a record since went into it: one that did not fit begins the next
// page, and the page it left is on disk as it is (an 8 KiB write and its flush cost 15–20 µs
// more than 4 KiB on a 2-vCPU VM's disk, and a third of a claim's records begin a page).
func (s *segment) take(buf []byte) (pageWrite, []byte, bool) {
	if s.off == s.written {
		return pageWrite{}, buf, false
	}
	from := s.unwrittenFrom/pageSize*pageSize - s.winOff
	end := (s.off - s.winOff + pageSize - 1) / pageSize * pageSize
	n := end - from
	if len(buf)+n > cap(buf) {
		grown := alignedPages(max(len(buf)+n, 2*cap(buf)))[:len(buf)]
		copy(grown, buf)
		buf = grown
	}
	start, at := len(buf), s.winOff+from
	buf = append(buf, s.win[from:end]...)
	s.written = s.off
	if last := s.off / pageSize * pageSize; last > s.winOff {
		kept := copy(s.win, s.win[last-s.winOff:end])
		clear(s.win[kept:end])
		s.winOff = last
	}
	return pageWrite{seg: s, at: at, pages: buf[start:]}, buf, true
}

// alignedPages is n bytes (a multiple of pageSize) aligned to a page, as O_DIRECT needs.
func alignedPages(n int) []byte {
	n = (n + pageSize - 1) / pageSize * pageSize
	b := make([]byte, n+pageSize)
	skip := (pageSize - int(uintptr(unsafe.Pointer(&b[0]))%pageSize)) % pageSize
	return b[skip : skip+n : skip+n]
}

// openSegment opens an empty segment for writing.
func openSegment(path string, index uint64) (*segment, error) {
	direct := true
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
	if errors.Is(err, unix.EINVAL) { // tmpfs and others: no direct I/O
		direct = false
		f, err = os.OpenFile(path, os.O_RDWR, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("kv: open log segment: %w", err)
	}
	s := &segment{index: index, file: f, direct: direct, win: alignedPages(pageSize)}
	s.flush = flushTarget(filepath.Dir(path), s)
	return s, nil
}

func (s *segment) close() {
	s.file.Close()
	if s.flush != nil {
		s.flush.Close()
	}
}

func segmentName(index uint64) string { return fmt.Sprintf("%06d%s", index, segmentExt) }

// segmentIndexes lists the log's segments in dir, oldest first.
func segmentIndexes(dir string) ([]uint64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("kv: %w", err)
	}
	var out []uint64
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), segmentExt)
		if !ok {
			continue
		}
		i, err := strconv.ParseUint(name, 10, 64)
		if err != nil {
			continue
		}
		out = append(out, i)
	}
	slices.Sort(out)
	return out, nil
}

// zeroFill is what createSegment writes: never written itself, its pages are the kernel's zero
// page, where a buffer made per segment was a MiB of garbage for every two MiB of log.
var zeroFill [1 << 20]byte

// createSegment writes a new segment of zeros and syncs it and the directory, so that it, its
// name and its blocks are durable before any record is: a record's own sync then writes only
// the record.
func createSegment(dir string, index uint64) (*segment, error) {
	path := filepath.Join(dir, segmentName(index))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("kv: create log segment: %w", err)
	}
	for off := int64(0); off < segmentSize && err == nil; off += int64(len(zeroFill)) {
		_, err = f.WriteAt(zeroFill[:], off)
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = SyncDir(dir)
	}
	f.Close()
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("kv: create log segment %s: %w", path, err)
	}
	return openSegment(path, index)
}

// logScan is what the log in a directory holds: every valid record up to the first torn or
// damaged one, in order.
type logScan struct {
	records    []*record
	checkpoint uint64 // the last checkpoint record's
	end        uint64 // ts of the last valid record; 0 when there is none
	segments   []uint64
	// badSegment and badOffset locate the first bad record (badSegment 0: none); everything from
	// there on holds nothing valid and is zeroed or removed at Open.
	badSegment uint64
	badOffset  int
}

// scanLog reads the log in dir. A bad record followed by a valid record that says the bad one was
// already durable (its synced field) is damage, not a torn tail: *CorruptError.
func scanLog(dir string) (*logScan, error) {
	indexes, err := segmentIndexes(dir)
	if err != nil {
		return nil, err
	}
	s := &logScan{segments: indexes}
	for _, index := range indexes {
		path := filepath.Join(dir, segmentName(index))
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("kv: %w", err)
		}
		if s.badSegment != 0 {
			if err := checkAfterBad(dir, path, data, 0, s.end); err != nil {
				return nil, err
			}
			continue
		}
		first := true
		off := 0
		for off = recordStart(data, off); off >= 0; off = recordStart(data, off) {
			r, n, ok := recordAt(data, off)
			if ok && (first && r.ts > s.end || r.ts == s.end+1) {
				s.records = append(s.records, r)
				s.end = r.ts
				if r.kind == kindCheckpoint {
					s.checkpoint = r.checkpoint
				}
				first = false
				off += n
				continue
			}
			s.badSegment, s.badOffset = index, off
			if err := checkAfterBad(dir, path, data, off+1, s.end); err != nil {
				return nil, err
			}
			break
		}
	}
	return s, nil
}

// checkAfterBad looks from off on for a valid record written after the bad one's sync (its
// synced field beyond end, the last good record): that one was acknowledged, so the bad record
// before it is damage, not a torn write of a commit never acknowledged.
func checkAfterBad(dir, path string, data []byte, off int, end uint64) error {
	for p := off; p+recordHeader+bodyHeader <= len(data); p++ {
		if data[p] == 0 && p%pageSize == 0 && allZero(data[p:min(p+pageSize, len(data))]) {
			p += pageSize - 1
			continue
		}
		if ts := binary.LittleEndian.Uint64(data[p+recordHeader:]); ts <= end || ts-end > 1<<32 {
			continue // cannot be a later record: spare the CRC
		}
		if r, _, ok := recordAt(data, p); ok && r.synced > end {
			return &CorruptError{Dir: dir, File: path, Problem: fmt.Sprintf(
				"a damaged record after commit %d is followed at byte %d by commit %d, written once commit %d was durable",
				end, p, r.ts, r.synced)}
		}
	}
	return nil
}

// truncateLog makes the log end at its first bad record: the rest of that segment is zeroed and
// synced, and later segments, which hold nothing valid, are removed.
func truncateLog(dir string, s *logScan) error {
	if s.badSegment == 0 {
		return nil
	}
	kept := s.segments[:0]
	for _, index := range s.segments {
		path := filepath.Join(dir, segmentName(index))
		if index <= s.badSegment {
			kept = append(kept, index)
		}
		switch {
		case index == s.badSegment:
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				return fmt.Errorf("kv: %w", err)
			}
			info, err := f.Stat()
			if err == nil {
				_, err = f.WriteAt(make([]byte, info.Size()-int64(s.badOffset)), int64(s.badOffset))
			}
			if err == nil {
				err = datasync(f)
			}
			f.Close()
			if err != nil {
				return fmt.Errorf("kv: zero the torn tail of %s: %w", path, err)
			}
		case index > s.badSegment:
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("kv: %w", err)
			}
		}
	}
	s.segments = kept
	return SyncDir(dir)
}

// pwriteAll writes b at off.
func pwriteAll(f *os.File, b []byte, off int) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(int(f.Fd()), b, int64(off))
		if err != nil {
			return err
		}
		b, off = b[n:], off+n
	}
	return nil
}
