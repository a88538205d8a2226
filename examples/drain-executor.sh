#!/usr/bin/env bash
# drain-executor.sh: take a cockpitfs stack down through its drain/ files (docs/spec.md §7).
#
# usage: examples/drain-executor.sh STACK_DIR [FAIL_ONCE_MARKER]
#   STACK_DIR         e.g. $M/app/stacks/feature-x
#   FAIL_ONCE_MARKER  optional: the first reclaim of $FAIL_TARGET fails (and creates this file), so
#                     the loop shows how a failed action is retried
# environment:
#   DRAIN        the request to reserve (default: "down volume:db volume:cache")
#   WORK         where volume:<name> lives, as the directory $WORK/<name> (default: .); nothing
#                outside it is ever removed, whatever the target or a link in WORK says
#   FAIL_TARGET  the target FAIL_ONCE_MARKER fails (default: volume:cache)
#
# Each write to a drain file is one command whose refusal the write itself reports, so `set -e`
# stops the script at the first refusal; the stack's events file says why. Rerunning the script
# resumes: writing the same request again is accepted and changes nothing (an attempt left active
# by a killed run is refused until `echo terminated > $S/drain/repair` records it failed).
set -euo pipefail

S=${1:?usage: drain-executor.sh STACK_DIR [FAIL_ONCE_MARKER]}
MARKER=${2:-}
DRAIN=${DRAIN:-down volume:db volume:cache}
WORK=${WORK:-.}
FAIL_TARGET=${FAIL_TARGET:-volume:cache}
WORK_REAL=$(realpath -m -- "$WORK")

echo "$DRAIN" > "$S/drain/request"

# drain/request reads empty once the last action's success has released the stack.
while [ -n "$(cat "$S/drain/request")" ]; do
	# The attempt's executor is this script (the writer); repair can prove it gone if it dies.
	echo start > "$S/drain/attempt"
	read -r stage target < <(python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); print(a["currentStage"], a["currentTarget"])' "$S/drain/attempt")
	case $stage in
	runtime-stop)
		echo "stop $target" # e.g. docker compose stop
		;;
	reclaim)
		if [ -n "$MARKER" ] && [ "$target" = "$FAIL_TARGET" ] && [ ! -e "$MARKER" ]; then
			touch "$MARKER"
			echo "reclaim $target failed"
			echo failure > "$S/drain/outcome"
			continue
		fi
		# The daemon refuses a target with "..", "/…" or a control byte; links inside WORK could
		# still lead out, so what is removed is resolved first and must lie below WORK.
		path=$(realpath -m -- "$WORK/${target#volume:}")
		case $path in
		"$WORK_REAL"/?*) ;;
		*)
			echo "reclaim $target: $path is not inside $WORK_REAL: refused" >&2
			echo failure > "$S/drain/outcome"
			exit 1
			;;
		esac
		echo "reclaim $target"
		rm -rf -- "$path" # e.g. docker volume rm
		;;
	*)
		echo "unknown stage $stage" >&2
		exit 1
		;;
	esac
	echo success > "$S/drain/outcome"
done
echo drained
