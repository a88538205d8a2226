package engine

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/cockpitfs/cockpitfs/engine/listeners"
	"github.com/cockpitfs/cockpitfs/engine/portdecl"
	"github.com/cockpitfs/cockpitfs/storage"
)

// Observation codes and owners of a stack's health, in the seeds' environment-observation shape
// (observeClaimState, observePortFamily, observePortListeners).
const (
	codeClaimState     = "CLAIM_STATE_UNHEALTHY"
	codePortFamily     = "PORT_FAMILY_COLLISION"
	codePortListener   = "PORT_LISTENER_ABSENT"
	codeEphemeralRange = "PORT_FAMILY_EPHEMERAL_OVERLAP"
	// codeDeclarationChanged: the lease's [ports] declaration is no longer the config's (the
	// seeds' inspectRecordedPortDeclaration, under the code a joining claim is refused with).
	codeDeclarationChanged = "CONFIG_CHANGED_DURING_EXECUTION"

	claimsOwner = "environment-claims"
	portsOwner  = "environment-port-coordination"
)

// observed states.
const (
	observedAvailable   = "available"
	observedUnavailable = "unavailable"
	observedFailed      = "failed"
)

// Observation is one line of a stack's health. A healthy observation is available with value true.
type Observation struct {
	Code string `json:"code"`
	// Result is "pass" when the observation shows what a healthy stack shows, else "fail": the
	// code names the failure the observation checks for, whichever the result.
	Result        string        `json:"result"`
	Owner         string        `json:"owner"`
	StackID       string        `json:"stackId"`
	Source        string        `json:"source"`
	Target        string        `json:"target,omitempty"`
	Observed      observed      `json:"observed"`
	Expectation   expectation   `json:"expectation"`
	Applicability applicability `json:"applicability"`
	Freshness     freshness     `json:"freshness"`
	Remedy        string        `json:"remedy"`
}

// observed is what was seen: a value when available, a reason when not (or when the value is false).
type observed struct {
	State      string `json:"state"`
	Value      *bool  `json:"value,omitempty"`
	Reason     string `json:"reason,omitempty"`
	ObservedAt string `json:"observedAt"`
}

// expectation is the value a healthy stack shows.
type expectation struct {
	Kind  string `json:"kind"`
	Value bool   `json:"value"`
}

// applicability says when the observation counts.
type applicability struct {
	State   string `json:"state"`
	Posture string `json:"posture"`
}

// freshness says how old the evidence is; health is always observed on read.
type freshness struct {
	State string `json:"state"`
}

// Health observes the stack now: whether its cockpit's records are readable and consistent,
// whether the machine's active leases are pairwise disjoint, whether something listens on each
// leased port, and whether its ports lie in the kernel's ephemeral range. A stack that does not
// exist is NotFound.
func (e *Engine) Health(cockpit, stack string) ([]Observation, error) {
	stored, err := e.healthStoreReads(cockpit, stack)
	if err != nil {
		return nil, err
	}
	r, readErr, inventory, configured, declared := stored.r, stored.readErr, stored.inventory, stored.configured, stored.declared
	if e.holds != nil && readErr == nil && r.Value.Lease.Active() {
		// A port another daemon took while this one was down: taken back if it has been let go.
		var problems []string
		if inventory.collision != "" {
			problems = append(problems, inventory.collision)
		}
		for _, l := range e.holds.retake(stackKey(cockpit, stack)) {
			problems = append(problems, l.String()+" ("+l.Why+")")
		}
		inventory.collision = strings.Join(problems, "; ")
	}
	at := stamp(e.now())
	base := Observation{
		StackID:       StackID(cockpit, stack),
		Source:        cockpit + "/stacks/" + stack + "/record",
		Expectation:   expectation{Kind: "equal", Value: true},
		Applicability: applicability{State: "required", Posture: "environment"},
		Freshness:     freshness{State: "current"},
	}
	claim := base
	claim.Code, claim.Owner, claim.Remedy = codeClaimState, claimsOwner, "repair or release malformed coordination state (stop the daemon, run cockpitfs verify)"
	if readErr != nil {
		reason := strings.ReplaceAll(readErr.Error(), "\n", "; ")
		claim.Observed = observed{State: observedFailed, Reason: reason, ObservedAt: at}
		family := portFamilyObservation(base, nil, healthInventory{unsound: "the stack's record is unreadable: " + reason}, listenerEvidence{}, at)
		return judged([]Observation{claim, family}), nil
	}
	if inventory.unsound != "" {
		claim.Observed = observed{State: observedFailed, Reason: inventory.unsound, ObservedAt: at}
	} else {
		claim.Observed = available(true, "", at)
	}
	lease := r.Value.Lease
	var evidence listenerEvidence
	if lease.Active() {
		evidence.busy, evidence.err = listeners.Listening(leasePorts(lease))
	}
	capacity := 4 // claim, family, declaration, ephemeral; and a listener a port
	if lease.Active() {
		capacity += len(lease.Ports)
	}
	obs := make([]Observation, 0, capacity)
	obs = append(obs, claim, portFamilyObservation(base, lease, inventory, evidence, at))
	if lease.Active() {
		obs = append(obs, declarationObservation(base, lease, configured, declared, cockpit, at))
		obs = append(obs, listenerObservations(base, lease, evidence, at)...)
		obs = append(obs, ephemeralObservation(base, leasePorts(lease), "leased", at))
	} else if configured {
		// The candidates only when no lease names the ports: listing them walks every family.
		obs = append(obs, ephemeralObservation(base, candidatePorts(declared), "candidate", at))
	} else {
		o := ephemeralBase(base)
		o.Observed = observed{State: observedUnavailable, Reason: "the cockpit has no port declaration", ObservedAt: at}
		obs = append(obs, o)
	}
	return judged(obs), nil
}

// healthReads is what a health read takes from the store for one stack.
type healthReads struct {
	r          Record
	readErr    error // the record does not decode or breaks its invariants
	inventory  healthInventory
	configured bool
	declared   portdecl.Declaration
}

// healthStoreReads reads what health observes of the store: the stack's record, its cockpit's
// declaration, its lease's index entries and the inventory around it. While no commit has begun
// since the last health read of the stack, the store holds what that read found, and it is reused
// (healthCache); the store is still asked, in an empty View, whether it has failed closed.
func (e *Engine) healthStoreReads(cockpit, stack string) (healthReads, error) {
	key := stackKey(cockpit, stack)
	at, quiet := e.healthCache.now()
	if reads, ok := e.healthCache.get(key, at); ok { // never kept over a shared store (below)
		return reads, e.db.View(func(storage.Txn) error { return nil })
	}
	var reads healthReads
	_, gen, _ := e.records.get(key)
	err := e.observeInventory(cockpit, func(tx storage.Txn, inv healthInventory) error {
		data, err := tx.Get(key)
		if errors.Is(err, storage.ErrNotFound) {
			return refuse(NotFound, StackID(cockpit, stack), "", "stack %s/%s does not exist", cockpit, stack)
		}
		if err != nil {
			return err
		}
		read, err := e.recordOf(tx, key, data)
		switch {
		case isMalformed(err):
			reads.readErr, err = err, nil
		case err != nil:
			return err
		case read.checked:
			reads.r = read.Record // these very bytes passed checkRecord when this engine wrote or read them
		default:
			reads.r, reads.readErr = read.Record, checkRecord(read.Record)
			if reads.readErr == nil {
				// Kept checked: the next read, or commit, of these bytes need not check them again.
				read.checked = true
				e.records.put(key, read, gen)
			}
		}
		if m, err := e.loadCockpit(tx, cockpit); err == nil {
			if cfg, ok := m.config(); ok {
				reads.configured, reads.declared = true, cfg.Declaration
			}
		}
		reads.inventory = inv
		if reads.readErr == nil && reads.r.Value.Lease.Active() {
			err = reads.inventory.checkIndexed(tx, reads.r)
		}
		return err
	})
	if err == nil && quiet && !e.shared {
		e.healthCache.put(key, reads, at)
	}
	return reads, err
}

// healthCache keeps each stack's last healthReads while the store cannot have changed: every
// commit moves gen when it begins (before anything it writes can be read), dropping every entry,
// and again when it ends; reads are kept only when taken with no commit under way.
type healthCache struct {
	mu       sync.Mutex // guards every field below; a leaf
	gen      uint64
	underway int
	m        map[string]healthReads
}

// now is the generation, and whether no commit is under way.
func (c *healthCache) now() (gen uint64, quiet bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen, c.underway == 0
}

// get returns key's reads if they were taken at generation at, which is still the current one.
func (c *healthCache) get(key string, at uint64) (healthReads, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	reads, ok := c.m[key]
	return reads, ok && c.gen == at
}

// put keeps reads taken at generation at, unless a commit began since.
func (c *healthCache) put(key string, reads healthReads, at uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != at {
		return
	}
	if c.m == nil {
		c.m = map[string]healthReads{}
	}
	c.m[key] = reads
}

// commitBegins and commitEnds bracket a commit.
func (c *healthCache) commitBegins(string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.underway++
	c.m = nil // of a store that is about to change: removed stacks' entries go too
}

func (c *healthCache) commitOrdered(string, *commitOutcome) {}

func (c *healthCache) commitEnds(string, *commitOutcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.underway--
}

// Results of an observation.
const (
	resultPass = "pass"
	resultFail = "fail"
)

// judged sets each observation's result: pass only when the value was observed and is the one
// expected; an observation that could not be made fails, with its reason.
func judged(obs []Observation) []Observation {
	for i, o := range obs {
		obs[i].Result = resultFail
		if o.Observed.State == observedAvailable && o.Observed.Value != nil && *o.Observed.Value == o.Expectation.Value {
			obs[i].Result = resultPass
		}
	}
	return obs
}

func available(value bool, reason, at string) observed {
	return observed{State: observedAvailable, Value: &value, Reason: reason, ObservedAt: at}
}

// healthInventory is what health reads of the records around a stack, as the seeds' observations
// read their inventories: whether the cockpit's records are sound (readActiveStackInventory
// refuses on the first broken one, or on more stacks than it reads), and whether the machine's
// active leases share a port (readRootPortInventory, which skips other cockpits' unreadable
// records).
type healthInventory struct {
	unsound   string // why the cockpit's inventory is unsound, "" when sound
	collision string // the ports two active leases share, or this lease's index problems; "" when none
}

// listenerEvidence is the host's listener check of a lease's ports, read at the observation.
type listenerEvidence struct {
	busy []int
	err  error
}

// checkIndexed adds to the collision every port of r's active lease the machine's port index
// does not give to r's stack.
func (inv *healthInventory) checkIndexed(tx storage.Txn, r Record) error {
	lease := r.Value.Lease
	problems := []string{}
	if inv.collision != "" {
		problems = append(problems, inv.collision)
	}
	indexed, err := leaseIndexProblems(tx, r.Cockpit, r.Stack, lease)
	if err != nil {
		return err
	}
	problems = append(problems, indexed...)
	inv.collision = strings.Join(problems, "; ")
	return nil
}

// portFamilyObservation is the seeds' observePortFamily: failed when the inventory cannot be
// read, false when two active leases share a port, true only for an active lease with current
// host-listener evidence, unavailable otherwise.
func portFamilyObservation(base Observation, lease *Lease, inv healthInventory, evidence listenerEvidence, at string) Observation {
	o := base
	o.Code, o.Owner, o.Remedy = codePortFamily, portsOwner, "lease the declared port family before starting the stack"
	o.Source = "ports"
	switch {
	case inv.unsound != "":
		o.Observed = observed{State: observedFailed, Reason: "the coordination records cannot be trusted: " + inv.unsound, ObservedAt: at}
	case inv.collision != "":
		o.Observed = available(false, inv.collision, at)
	case !lease.Active():
		o.Observed = observed{State: observedUnavailable, Reason: "the stack has no active port-family lease", ObservedAt: at}
	case evidence.err != nil:
		o.Observed = observed{State: observedUnavailable, Reason: "current host-listener evidence is unavailable: " + evidence.err.Error(), ObservedAt: at}
	default:
		o.Observed = available(true, "", at)
	}
	return o
}

// listenerObservations says, per leased port in key order, whether something listens on it now:
// whether the stack's services are up.
func listenerObservations(base Observation, lease *Lease, evidence listenerEvidence, at string) []Observation {
	keys := sortedPortKeys(lease.Ports)
	ports := make([]int, len(keys))
	for i, k := range keys {
		ports[i] = lease.Ports[k]
	}
	err := evidence.err
	listening := map[int]bool{}
	for _, p := range evidence.busy {
		listening[p] = true
	}
	out := make([]Observation, len(keys))
	for i, key := range keys {
		port := ports[i]
		o := base
		o.Code, o.Owner = codePortListener, portsOwner
		p := strconv.Itoa(port)
		o.Source = "tcp:" + p
		o.Target = key + "=" + p
		o.Remedy = "start the stack's service for " + key + " on port " + p + " (see env)"
		switch {
		case err != nil:
			o.Observed = observed{State: observedUnavailable, Reason: err.Error(), ObservedAt: at}
		case listening[port]:
			o.Observed = available(true, "", at)
		default:
			o.Observed = available(false, fmt.Sprintf("nothing listens on TCP port %d", port), at)
		}
		out[i] = o
	}
	return out
}

func ephemeralBase(base Observation) Observation {
	o := base
	o.Code, o.Owner = codeEphemeralRange, portsOwner
	o.Source = ephemeralRangePath
	o.Remedy = "move ports.bases out of the kernel's ephemeral range, or reserve the ports in net.ipv4.ip_local_reserved_ports"
	return o
}

// ephemeralObservation says whether none of ports (the lease's, or the config's candidates when
// the stack holds no lease) lies in the kernel's ephemeral range.
func ephemeralObservation(base Observation, ports []int, what, at string) Observation {
	o := ephemeralBase(base)
	r, err := readEphemeralRange()
	if err != nil {
		o.Observed = observed{State: observedUnavailable, Reason: err.Error(), ObservedAt: at}
		return o
	}
	inside := r.inside(ports)
	if len(inside) == 0 {
		o.Observed = available(true, "", at)
		return o
	}
	o.Observed = available(false, fmt.Sprintf("%s ports %s lie in the kernel's ephemeral port range (%s); the kernel may hand them to any outgoing connection",
		what, summarizePorts(inside), r), at)
	return o
}

func leasePorts(l *Lease) []int { return familyPorts(portdecl.Family{Ports: l.Ports}) }

// declarationObservation says whether an active lease was taken under the config's current
// [ports] declaration: when not, every claim (a new holder's, an existing one's touch) is refused
// (ESTALE) and the stack keeps its old ports until it is drained.
func declarationObservation(base Observation, lease *Lease, configured bool, declared portdecl.Declaration, cockpit, at string) Observation {
	o := base
	o.Code, o.Owner, o.Source = codeDeclarationChanged, portsOwner, cockpit+"/config"
	o.Remedy = "drain the stack (echo down > drain/request, then its attempts) and claim again to lease the family the config declares now"
	switch {
	case !configured:
		o.Observed = observed{State: observedUnavailable, Reason: "the cockpit has no port declaration", ObservedAt: at}
	case lease.Declaration.Equal(declared):
		o.Observed = available(true, "", at)
	default:
		o.Observed = available(false, fmt.Sprintf("the lease was taken under another [ports] declaration (step %d, count %d, bases %v) than the config's (step %d, count %d, bases %v); claims, a holder's touch included, are refused until the stack is drained",
			lease.Declaration.Step, lease.Declaration.Count, lease.Declaration.Bases, declared.Step, declared.Count, declared.Bases), at)
	}
	return o
}
