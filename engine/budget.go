package engine

import (
	"context"
	"sync"
	"time"
)

// budgetContext is context.WithDeadline(parent, deadline) whose timer is armed only once
// something waits on it (Done, or Err before the deadline has passed): an uncontended commit on
// the local store never does, and arming and stopping a timer cost a commit ≈ 3.5 µs (pprof).
// Once armed, every method is the armed context's.
type budgetContext struct {
	parent   context.Context
	deadline time.Time

	mu     sync.Mutex      // guards armed and cancel; a leaf
	armed  context.Context // nil until armed
	cancel context.CancelFunc
}

// withBudget returns parent bounded by d and the function that releases it, as
// context.WithTimeout does.
func withBudget(parent context.Context, d time.Duration) (*budgetContext, func()) {
	b := &budgetContext{parent: parent, deadline: time.Now().Add(d)}
	return b, b.release
}

// arm is the context.WithDeadline the budget stands for, made at the first call.
func (b *budgetContext) arm() context.Context {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.armed == nil {
		b.armed, b.cancel = context.WithDeadline(b.parent, b.deadline)
	}
	return b.armed
}

// current is the armed context, nil while there is none.
func (b *budgetContext) current() context.Context {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.armed
}

func (b *budgetContext) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cancel != nil {
		b.cancel()
	}
}

func (b *budgetContext) Deadline() (time.Time, bool) {
	if d, ok := b.parent.Deadline(); ok && d.Before(b.deadline) {
		return d, true
	}
	return b.deadline, true
}

func (b *budgetContext) Done() <-chan struct{} { return b.arm().Done() }

func (b *budgetContext) Err() error {
	if armed := b.current(); armed != nil {
		return armed.Err()
	}
	if b.parent.Err() == nil && time.Now().Before(b.deadline) {
		return nil
	}
	return b.arm().Err()
}

// Value is the armed context's once there is one, so that contexts derived from the budget find
// its cancellation as they would find context.WithDeadline's.
func (b *budgetContext) Value(key any) any {
	if armed := b.current(); armed != nil {
		return armed.Value(key)
	}
	return b.parent.Value(key)
}
