package engine

// drainPlan is what a drain request fixes: the seeds' request fields, also the JSON form of a
// drain/request write.
type drainPlan struct {
	Purpose                      string        `json:"purpose"`
	StackID                      string        `json:"stackId"`
	HolderID                     string        `json:"holderId"`
	RequesterID                  string        `json:"requesterId"`
	ConfigSha256                 string        `json:"configSha256"`
	PlanDigest                   string        `json:"planDigest"`
	OperationBasis               string        `json:"operationBasis"`
	Generation                   string        `json:"generation"`
	TargetIDs                    []string      `json:"targetIds"`
	Actions                      []drainAction `json:"actions"`
	ExpectedCoordinationRevision int64         `json:"expectedCoordinationRevision"`
}

// Drain is a reserved drain (the seeds' DrainReservation), persisted in the record: its plan and
// its progress. HolderName and UID extend it so the tree can name and authorise the drain's holder.
type Drain struct {
	drainPlan
	CoordinationRevision int64    `json:"coordinationRevision"`
	CompletedActionCount int      `json:"completedActionCount"`
	ProgressRevision     int64    `json:"progressRevision"`
	ReservedAt           string   `json:"reservedAt"`
	ReservationID        string   `json:"reservationId"`
	Attempt              *Attempt `json:"attempt"`
	HolderName           string   `json:"holderName"`
	UID                  uint32   `json:"uid"`
}

// drainAction is one step of a drain: runtime-stop of the stack, then one reclaim per target.
type drainAction struct {
	Stage            string             `json:"stage"`
	TargetID         string             `json:"targetId"`
	ValidForMs       int64              `json:"validForMs"`
	TargetCommitment *reclaimCommitment `json:"targetCommitment,omitempty"`
}

// reclaimCommitment binds a reclaim action to the target it names: sha256 over a canonical JSON body.
type reclaimCommitment struct {
	Format string `json:"format"`
	Sha256 string `json:"sha256"`
	Body   string `json:"body"`
}

// Attempt is one try of the current action. ExecutorPID and ExecutorStart extend the seeds'
// attempt: repair proves the executor gone by them.
type Attempt struct {
	AttemptID         string   `json:"attemptId"`
	ReservationID     string   `json:"reservationId"`
	Purpose           string   `json:"purpose"`
	TargetIDs         []string `json:"targetIds"`
	Generation        string   `json:"generation"`
	ActionIndex       int      `json:"actionIndex"`
	CurrentTarget     string   `json:"currentTarget"`
	CurrentStage      string   `json:"currentStage"`
	CommittedRevision int64    `json:"committedRevision"`
	CommittedAt       string   `json:"committedAt"`
	ValidThrough      string   `json:"validThrough"`
	Status            string   `json:"status"`
	FailedRevision    *int64   `json:"failedRevision"`
	FailedAt          *string  `json:"failedAt"`
	ExecutorPID       int      `json:"executorPid,omitempty"`
	ExecutorStart     string   `json:"executorStart,omitempty"`
	// Planning extends an active reclaim's attempt with what its start replaced, so the record
	// the reclaim was planned from can be served (see Record.PlanningRecord).
	Planning *attemptPlanning `json:"planning,omitempty"`
}

// attemptPlanning is what a reclaim attempt's start replaced of the record: its updatedAt and
// its drain's attempt (none before a first try, the failed one before a retry). With them the
// planning record (the seeds' reclaimDrainStep planningRecord) is the attempt's own record one
// revision back.
type attemptPlanning struct {
	UpdatedAt string   `json:"updatedAt"`
	Attempt   *Attempt `json:"attempt"`
}

const (
	stageRuntimeStop = "runtime-stop"
	stageReclaim     = "reclaim"
	attemptActive    = "active"
	attemptFailed    = "failed"
	commitmentFormat = "cockpit-reclaim-target/v1"
	maxTargetBytes   = 512
	maxValidForMs    = 300000
)

// boundaryRevision is the revision a record carrying d must have: the drain's last own step.
func (d *Drain) boundaryRevision() int64 {
	switch {
	case d.Attempt == nil:
		return d.ProgressRevision
	case d.Attempt.Status == attemptFailed && d.Attempt.FailedRevision != nil:
		return *d.Attempt.FailedRevision
	default:
		return d.Attempt.CommittedRevision
	}
}
