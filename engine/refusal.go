package engine

import (
	"errors"
	"fmt"

	"github.com/cockpitfs/cockpitfs/storage"
)

// Code names a refusal; the codes and their meaning are SPEC §8's.
type Code string

const (
	StateRecordMalformed         Code = "STATE_RECORD_MALFORMED"
	PortFamilyOutOfRange         Code = "PORT_FAMILY_OUT_OF_RANGE"
	ClaimCoTenant                Code = "CLAIM_CO_TENANT"
	PortLeaseExhausted           Code = "PORT_LEASE_EXHAUSTED"
	PortFamilyCollision          Code = "PORT_FAMILY_COLLISION"
	PortListenerEvidenceInvalid  Code = "PORT_LISTENER_EVIDENCE_INVALID"
	ConfigChangedDuringExecution Code = "CONFIG_CHANGED_DURING_EXECUTION"
	ExecutionPreconditionChanged Code = "EXECUTION_PRECONDITION_CHANGED"
	DrainAttemptRepairRequired   Code = "DRAIN_ATTEMPT_REPAIR_REQUIRED"
	StateLocked                  Code = "STATE_LOCKED"
	PermissionDenied             Code = "PERMISSION_DENIED"
	CommandTooLarge              Code = "COMMAND_TOO_LARGE"
	UndefinedName                Code = "UNDEFINED_NAME"
	NotFound                     Code = "NOT_FOUND"
	Exists                       Code = "EXISTS"
	NotEmpty                     Code = "NOT_EMPTY"
	// Unsupported: an operation the tree does not offer on an existing name (chmod, chown,
	// setting times, rename), since owners, modes and times are derived from the record.
	Unsupported Code = "UNSUPPORTED_OPERATION"
	// StateRootUnavailable is the seeds' code for a store that cannot be read or written: an I/O
	// error, a failed fdatasync, a closed store.
	StateRootUnavailable Code = "STATE_ROOT_UNAVAILABLE"
	// The limits below have no code of their own in the seeds (a holder or record past them
	// fails the seeds' schema, STATE_RECORD_MALFORMED, the inventory past them is refused on read).
	ClaimHolderLimit    Code = "CLAIM_HOLDER_LIMIT"     // a stack has MaxHolders holders
	StateInventoryLimit Code = "STATE_INVENTORY_LIMIT"  // a cockpit has MaxStacks stacks
	StateRecordTooLarge Code = "STATE_RECORD_TOO_LARGE" // a record would pass MaxRecordBytes
	// PortLeaseUIDLimit: the claimant's uid already holds as many active leases as one uid may
	// (Engine.BoundLeases), so the families left stay for others.
	PortLeaseUIDLimit Code = "PORT_LEASE_UID_LIMIT"
	// CockpitUIDLimit: the caller's uid already has as many cockpits as one uid may
	// (Engine.BoundCockpits), so one user cannot fill the store and the daemon's memory.
	CockpitUIDLimit Code = "COCKPIT_UID_LIMIT"
	// StackUIDLimit: the caller's uid already made as many stacks as one uid may
	// (Engine.CountStacks), every cockpit counted.
	StackUIDLimit Code = "STACK_UID_LIMIT"
	// LifecycleEvidenceInvalid: evidence a caller hands back (the planning record a reclaim's
	// outcome names) is not what the engine issued for the step it applies to.
	LifecycleEvidenceInvalid Code = "LIFECYCLE_EVIDENCE_INVALID"
	// OpenSnapshotLimit: the opens of the caller's uid already hold as many snapshot bytes as one
	// uid's may, so one user's open files cannot exhaust the daemon's memory.
	OpenSnapshotLimit Code = "OPEN_SNAPSHOT_LIMIT"
	// ConfigEditLimit: the cockpit already has as many scratch files and directories beside its config, or
	// replacements of its config under way, as one cockpit may.
	ConfigEditLimit Code = "CONFIG_EDIT_LIMIT"
	// WaitUIDLimit: the caller's uid already has as many reads waiting in wait files as one uid
	// may, so one user's blocked reads cannot exhaust the daemon's memory.
	WaitUIDLimit Code = "WAIT_UID_LIMIT"
	// WriteAbandoned: a writer killed by a signal before it closed a document or ended a command's
	// line; nothing of what it wrote is applied.
	WriteAbandoned Code = "WRITE_ABANDONED"
	// MachineUnannounced: over a shared store, this daemon could not renew its machine's
	// announcement before an operation that creates or keeps a holder (proveMachine).
	MachineUnannounced Code = "MACHINE_UNANNOUNCED"
)

// Refusal is why an operation changed nothing: a value the adapter maps to an errno and an events
// line, never a string built where it is reported.
type Refusal struct {
	Code    Code
	Message string
	Target  string
	Fix     string
}

func (r *Refusal) Error() string {
	if r.Fix == "" {
		return fmt.Sprintf("%s: %s", r.Code, r.Message)
	}
	return fmt.Sprintf("%s: %s (fix: %s)", r.Code, r.Message, r.Fix)
}

func refuse(code Code, target, fix, format string, args ...any) *Refusal {
	return &Refusal{Code: code, Message: fmt.Sprintf(format, args...), Target: target, Fix: fix}
}

// AsRefusal extracts the refusal from err, so callers always have a code to report: a stored value
// that does not decode is STATE_RECORD_MALFORMED, any other error the store's failing
// (STATE_ROOT_UNAVAILABLE). No error is no refusal: nil.
func AsRefusal(err error) *Refusal {
	if err == nil {
		return nil
	}
	var r *Refusal
	if errors.As(err, &r) {
		return r
	}
	if errors.Is(err, storage.ErrLocked) {
		// A read the store could not serve in time (etcd: no quorum answered).
		return &Refusal{Code: StateLocked, Message: err.Error(), Fix: "retry"}
	}
	var m malformedValue
	if errors.As(err, &m) {
		return &Refusal{Code: StateRecordMalformed, Message: err.Error(), Fix: "stop the daemon and run cockpitfs verify"}
	}
	return &Refusal{Code: StateRootUnavailable, Message: err.Error(), Fix: "check the disk and the daemon's log, then retry"}
}

// isMalformed says err is a stored value that does not decode.
func isMalformed(err error) bool {
	var m malformedValue
	return errors.As(err, &m)
}

// malformedValue is a stored value that does not decode.
type malformedValue struct{ err error }

func (m malformedValue) Error() string { return m.err.Error() }
func (m malformedValue) Unwrap() error { return m.err }
