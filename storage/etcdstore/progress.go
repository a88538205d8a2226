package etcdstore

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A progress request (RequestProgress) asks the watch's member for the revision its events have
// reached, so that a cache behind a read's revision with no event on its way (a commit outside the
// prefix moved it) learns it is complete. etcd before 3.4.31 and 3.5.13 answers it at once with
// the member's current revision, even on a watch still catching up on events it has not yet sent
// (etcd issue 15220; Debian's etcd-server 3.4.23 does): a watch that starts or resumes behind, as
// after a member's restart, would make the cache look complete through events it does not hold,
// and a read would miss another daemon's acknowledged commit. Those are the versions Kubernetes'
// reads from its watch cache refuse too. With such a member the store sends no progress request
// and takes no progress notification: a cache behind a read's revision catches up by events, or
// the read goes to etcd (pinAtLeast).

// progressTrusted reports whether every member cfg's endpoints reach answers progress requests in
// order with its events; a member that does not answer now is not counted, and none answering
// counts as untrusted. It also reports the endpoint of the member that says it leads, and its
// term ("" when none does), for the store's connection to the leader (leader.go).
func progressTrusted(cli *clientv3.Client, endpoints []string, budget time.Duration) (trusted bool, leader string, term uint64) {
	answered, inOrder := false, true
	for _, endpoint := range endpoints {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		status, err := cli.Status(ctx, endpoint)
		cancel()
		if err != nil {
			continue
		}
		if leads(status) && status.RaftTerm >= term {
			leader, term = endpoint, status.RaftTerm
		}
		inOrder = inOrder && progressInOrder(status.Version)
		answered = true
	}
	return answered && inOrder, leader, term
}

// progressInOrder reports whether etcd version answers progress requests only once the watch's
// events up to the revision it names are sent: 3.4.31 and later 3.4s, 3.5.13 and later 3.5s,
// 3.6 and later.
func progressInOrder(version string) bool {
	var major, minor, patch int
	if _, err := fmt.Sscanf(version, "%d.%d.%d", &major, &minor, &patch); err != nil {
		return false
	}
	switch {
	case major != 3:
		return major > 3
	case minor == 4:
		return patch >= 31
	case minor == 5:
		return patch >= 13
	}
	return minor > 5
}
