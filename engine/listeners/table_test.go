package listeners

import (
	"strings"
	"testing"
)

// A snapshot in the kernel's exact layout: 0x1F90=8080 listens on 127.0.0.1, 0x0016=22 on 0.0.0.0,
// 0x1F91=8081 appears only as the local side of an ESTABLISHED connection, and 0x9C40=40000 only as
// the remote side of one.
const tcpSnapshot = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode                                                     
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 41311 1 0000000000000000 100 0 0 10 0                     
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1060 1 000000004785b766 100 0 0 10 0                      
   2: 0100007F:1F91 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 52214 1 0000000000000000 20 4 30 10 -1                    
`

const tcp6Snapshot = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F92 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 61001 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000000000000:01BB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 61002 1 0000000000000000 100 0 0 10 0
   2: 00000000000000000000000001000000:1F93 00000000000000000000000001000000:1F92 01 00000000:00000000 00:00000000 00000000  1000        0 61003 1 0000000000000000 20 4 30 10 -1
`

func parseSnapshot(t *testing.T, table string, ports ...int) map[int]bool {
	t.Helper()
	want := map[int]bool{}
	for _, port := range ports {
		want[port] = true
	}
	found := map[int]bool{}
	if err := parseTable(strings.NewReader(table), want, found); err != nil {
		t.Fatalf("parseTable: %v", err)
	}
	return found
}

func TestParseTableIPv4(t *testing.T) {
	found := parseSnapshot(t, tcpSnapshot, 8080, 22, 8081, 40000, 9999)
	if len(found) != 2 || !found[8080] || !found[22] {
		t.Fatalf("found %v, want exactly the LISTEN ports 8080 and 22", found)
	}
}

func TestParseTableOnlyMarksWantedPorts(t *testing.T) {
	found := parseSnapshot(t, tcpSnapshot, 22)
	if len(found) != 1 || !found[22] {
		t.Fatalf("found %v, want only 22", found)
	}
}

func TestParseTableIPv6(t *testing.T) {
	found := parseSnapshot(t, tcp6Snapshot, 8082, 443, 8083, 8080)
	if len(found) != 2 || !found[8082] || !found[443] {
		t.Fatalf("found %v, want exactly the LISTEN ports 8082 and 443", found)
	}
}

func TestParseTableHeaderOnlyIsFree(t *testing.T) {
	header := strings.SplitAfter(tcpSnapshot, "\n")[0]
	if found := parseSnapshot(t, header, 8080); len(found) != 0 {
		t.Fatalf("found %v in a table with no rows", found)
	}
}

func TestParseTableRejectsMalformed(t *testing.T) {
	header := strings.SplitAfter(tcpSnapshot, "\n")[0]
	listenRow := "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 41311 1\n"
	cases := map[string]string{
		"empty":             "",
		"bad header":        "sl remote_address\n" + listenRow,
		"no header":         listenRow,
		"too few fields":    header + "   0: 0100007F:1F90 00000000:0000\n",
		"non-hex port":      header + strings.Replace(listenRow, ":1F90", ":1G90", 1),
		"short port":        header + strings.Replace(listenRow, ":1F90", ":1F9", 1),
		"no port separator": header + strings.Replace(listenRow, "0100007F:1F90", "0100007F1F90", 1),
		"odd ip length":     header + strings.Replace(listenRow, "0100007F:", "100007F:", 1),
		"non-hex state":     header + strings.Replace(listenRow, " 0A ", " ZZ ", 1),
		"bad slot":          header + strings.Replace(listenRow, "0:", "0", 1),
		// The bad row is after a LISTEN row for the wanted port: the whole table is still rejected.
		"bad later row": header + listenRow + "   1: 0100007F:1F91 0100007F:xyz 01 0\n",
	}
	for name, table := range cases {
		t.Run(name, func(t *testing.T) {
			found := map[int]bool{}
			if err := parseTable(strings.NewReader(table), map[int]bool{8080: true}, found); err == nil {
				t.Fatalf("parseTable accepted %q (found %v)", table, found)
			}
		})
	}
}
