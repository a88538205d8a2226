package engine

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Keys of the store. Names never hold '/', so it separates components unambiguously.
//
//	c/<cockpit>              cockpitMeta
//	s/<cockpit>/<stack>      the stack's Record without its holders: its head (see saveRecord)
//	h/<cockpit>/<stack>/<holderId>        one Holder of the stack
//	d/<cockpit>/<stack>      DeclaredValues of the stack (declared-values)
//	p/<port, 5 digits>       PortOwner: the machine-wide index of active leases
//	n/<cockpit>              number of active leases in the cockpit
//	l/<cockpit>              the ports of the cockpit's active leases, sorted (see leasedPorts)
//	u/<uid>                  number of active leases taken by the uid's claims, every cockpit
//	k/<uid>                  number of cockpits the uid made that exist (those marked counted)
//	t/<uid>                  number of stacks that exist whose record names the uid as creator
//	t                        the stacks' creators are counted in t/ (see CountStacks)
//	e/<cockpit>/<stack|->/<seq, 16 hex>   one events line; "-" is the cockpit's own log
//	q/<cockpit>/<stack|->    the next events seq
//	o/<cockpit>/<stack|->    the events file's end: bytes ever appended to it (see EventsWindow)
//	w/<cockpit>/<stack|->    how many lines were ever appended to each window of the events file
//	x/<cockpit>/<stack|->/<window>/<n, 16 hex>   the seq of the window's line n (see appendEvent)
//	m/<boot id>/<daemon>     a daemon of that boot is alive (shared stores only; see machines)
const cockpitLevel = "-"

// Prefixes of whole key families, for scans.
const (
	cockpitsPrefix    = "c/"
	allStacksPrefix   = "s/"
	allHoldersPrefix  = "h/"
	portsPrefix       = "p/"
	allEventsPrefix   = "e/"
	uidLeasesPrefix   = "u/"
	uidCockpitsPrefix = "k/"
	uidStacksPrefix   = "t/"
	stacksCountedKey  = "t"
	declaredPrefix    = "d/"
)

func cockpitKey(cockpit string) string      { return cockpitsPrefix + cockpit }
func stackKey(cockpit, stack string) string { return allStacksPrefix + cockpit + "/" + stack }
func stacksPrefix(cockpit string) string    { return allStacksPrefix + cockpit + "/" }
func holdersPrefix(cockpit, stack string) string {
	return allHoldersPrefix + cockpit + "/" + stack + "/"
}
func holderKey(cockpit, stack, id string) string { return holdersPrefix(cockpit, stack) + id }
func cockpitHoldersPrefix(cockpit string) string { return allHoldersPrefix + cockpit + "/" }

// holderStackKey is the key of the stack whose holder's key is key.
func holderStackKey(key string) string {
	cockpit, rest, _ := strings.Cut(strings.TrimPrefix(key, allHoldersPrefix), "/")
	stack, _, _ := strings.Cut(rest, "/")
	return stackKey(cockpit, stack)
}

// declaredValuesKey holds a stack's DeclaredValues beside its record, so recording them neither
// moves the stack's revision nor waits for its drain.
func declaredValuesKey(cockpit, stack string) string { return declaredPrefix + cockpit + "/" + stack }
func portKey(port int) string {
	b := append(make([]byte, 0, len(portsPrefix)+5), portsPrefix...)
	for div := 10000; div > 1 && port < div; div /= 10 { // zero-padded to five digits
		b = append(b, '0')
	}
	return string(strconv.AppendInt(b, int64(port), 10))
}

// portOfKey is the port whose index key is key, if key is one portKey makes.
func portOfKey(key string) (int, bool) {
	digits, ok := strings.CutPrefix(key, portsPrefix)
	port, err := strconv.Atoi(digits)
	if !ok || err != nil || port < 1 || port > 65535 || portKey(port) != key {
		return 0, false // the round trip refuses any other spelling ("+8080", "8080 ")
	}
	return port, true
}

func leaseCountKey(cockpit string) string            { return "n/" + cockpit }
func leasedPortsKey(cockpit string) string           { return "l/" + cockpit }
func uidLeasesKey(uid uint32) string                 { return fmt.Sprintf("%s%d", uidLeasesPrefix, uid) }
func uidCockpitsKey(uid uint32) string               { return fmt.Sprintf("%s%d", uidCockpitsPrefix, uid) }
func uidStacksKey(uid uint32) string                 { return fmt.Sprintf("%s%d", uidStacksPrefix, uid) }
func eventsPrefix(cockpit, stack string) string      { return allEventsPrefix + cockpit + "/" + stack + "/" }
func eventsHeadKey(cockpit, stack string) string     { return "f/" + cockpit + "/" + stack }
func eventsSeqKey(cockpit, stack string) string      { return "q/" + cockpit + "/" + stack }
func eventsEndKey(cockpit, stack string) string      { return "o/" + cockpit + "/" + stack }
func eventsWindowsKey(cockpit, stack string) string  { return "w/" + cockpit + "/" + stack }
func eventsIndexPrefix(cockpit, stack string) string { return "x/" + cockpit + "/" + stack + "/" }
func eventsIndexKey(cockpit, stack, window string, n uint64) string {
	return string(appendHex16(append(append([]byte(eventsIndexPrefix(cockpit, stack)), window...), '/'), n))
}
func eventKey(cockpit, stack string, seq uint64) string {
	return string(appendHex16([]byte(eventsPrefix(cockpit, stack)), seq))
}

// appendHex16 appends n as 16 lowercase hex digits (fmt's %016x), so keys sort in number order.
func appendHex16(b []byte, n uint64) []byte {
	var digits [16]byte
	for i := len(digits) - 1; i >= 0; i-- {
		digits[i] = "0123456789abcdef"[n&0xf]
		n >>= 4
	}
	return append(b, digits[:]...)
}

// layoutParts is how many '/'-separated names follow each family's prefix in a key of the layout
// above; the port index's keys are portOfKey's.
var layoutParts = map[string]int{
	cockpitsPrefix: 1, allStacksPrefix: 2, allHoldersPrefix: 3, declaredPrefix: 2, "n/": 1, "l/": 1,
	uidLeasesPrefix: 1, uidCockpitsPrefix: 1, uidStacksPrefix: 1, allEventsPrefix: 3, "f/": 2,
	"q/": 2, "o/": 2, "w/": 2, "x/": 4, "m/": 2,
}

// inLayout says whether key is one of the layout's (whatever its value holds): a shared store
// keeps no value of any other key in memory (storage.Shared.Withhold), and verify names them.
// "migrating" is the mark an unfinished migration leaves (cmd/cockpitfs).
func inLayout(key string) bool {
	if key == stacksCountedKey || key == "migrating" {
		return true
	}
	if _, ok := portOfKey(key); ok {
		return true
	}
	family, rest, _ := strings.Cut(key, "/")
	parts, ok := layoutParts[family+"/"]
	if !ok || family == "p" {
		return false
	}
	names := strings.Split(rest, "/")
	if family+"/" == uidLeasesPrefix || family+"/" == uidCockpitsPrefix || family+"/" == uidStacksPrefix {
		// A uid as uidLeasesKey spells it: "u/01", "u/-1" or "u/4294967296" is no uid's count.
		uid, err := strconv.ParseUint(rest, 10, 32)
		return err == nil && strconv.FormatUint(uid, 10) == rest
	}
	return len(names) == parts && !slices.Contains(names, "")
}

func machinesPrefix(boot string) string     { return "m/" + boot + "/" }
func machineKey(boot, daemon string) string { return machinesPrefix(boot) + daemon }

func splitStackKey(key string) (cockpit, stack string) {
	rest := strings.TrimPrefix(key, allStacksPrefix)
	cockpit, stack, _ = strings.Cut(rest, "/")
	return cockpit, stack
}
