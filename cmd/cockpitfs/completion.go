package main

import (
	"fmt"
	"sort"
	"strings"
)

func completionCommand(args []string) error {
	if len(args) != 1 || args[0] != "bash" {
		return &usageError{command: "completion", msg: "completion supports bash only: cockpitfs completion bash"}
	}
	fmt.Print(bashCompletion())
	return nil
}

// bashCompletion completes commands, each command's flags, --log-level's values, directories
// for paths, and after `exec STACK_DIR --` the command being run. Each reply is one line of
// compgen's (mapfile), so a directory with a space is one word.
func bashCompletion() string {
	var names []string
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	var cases strings.Builder
	for _, name := range names {
		fmt.Fprintf(&cases, "\t%s) flags=%q ;;\n", name, strings.Join(flagNames(name), " "))
	}
	return `# bash completion for cockpitfs: source <(cockpitfs completion bash)
_cockpitfs() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd=${COMP_WORDS[1]} flags i
	if [ "$COMP_CWORD" -eq 1 ]; then
		mapfile -t COMPREPLY < <(compgen -W "` + strings.Join(names, " ") + ` --help --version" -- "$cur")
		return
	fi
	if [ "$cmd" = exec ]; then
		for ((i = 2; i < COMP_CWORD; i++)); do
			if [ "${COMP_WORDS[i]}" = -- ]; then
				mapfile -t COMPREPLY < <(compgen -c -- "$cur" | sort -u)
				[ $((i + 1)) -lt "$COMP_CWORD" ] && mapfile -t COMPREPLY < <(compgen -f -- "$cur")
				return
			fi
		done
	fi
	case $prev in
	--log-level) mapfile -t COMPREPLY < <(compgen -W "error info debug" -- "$cur"); return ;;
	--data) mapfile -t COMPREPLY < <(compgen -d -- "$cur"); return ;;
	--holder) return ;;
	esac
	case $cmd in
` + cases.String() + `	*) return ;;
	esac
	case $cmd in
	completion) mapfile -t COMPREPLY < <(compgen -W "bash" -- "$cur"); return ;;
	name) [ "$COMP_CWORD" -eq 2 ] && mapfile -t COMPREPLY < <(compgen -W "stack holder" -- "$cur"); [ "$prev" = stack ] && mapfile -t COMPREPLY < <(compgen -d -- "$cur"); return ;;
	help) mapfile -t COMPREPLY < <(compgen -W "` + strings.Join(names, " ") + `" -- "$cur"); return ;;
	esac
	if [[ $cur == -* ]]; then
		mapfile -t COMPREPLY < <(compgen -W "$flags" -- "$cur")
	else
		mapfile -t COMPREPLY < <(compgen -d -- "$cur")
	fi
}
complete -o filenames -F _cockpitfs cockpitfs
`
}
