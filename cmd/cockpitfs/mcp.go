package main

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/cockpitfs/cockpitfs/agent"
	"github.com/cockpitfs/cockpitfs/engine"
)

// mcpCommand serves the Model Context Protocol on stdin and stdout for one agent session
// (docs/agents.md), until the host closes stdin or signals it.
func mcpCommand(args []string) error {
	fset := newFlags("mcp")
	mount := fset.String("mount", defaultMount(), "")
	cockpit := fset.String("cockpit", "", "")
	holder := fset.String("holder", engine.NameFor("mcp-"+currentUserName()+"-"+strconv.Itoa(os.Getpid())), "")
	checkout := fset.String("dir", "", "")
	positional, err := parseInterspersed(fset, args)
	if err != nil {
		return err
	}
	if len(positional) != 0 {
		return &usageError{command: "mcp", msg: "mcp takes no arguments but its flags"}
	}
	// The server works from the checkout: a claim records the creating process's working
	// directory as the holder's checkout.
	if *checkout != "" {
		if err := os.Chdir(*checkout); err != nil {
			return err
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return err
	}
	srv, err := agent.New(agent.Options{Mount: *mount, Dir: dir, Cockpit: *cockpit, Holder: *holder, Version: buildVersion()})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	err = srv.Run(ctx, stdioTransport{})
	if ctx.Err() != nil {
		return nil // signalled: the session's holders are released, as at the end of stdin
	}
	return err
}

// defaultMount is $COCKPITFS_MOUNT, else ~/cockpit.
func defaultMount() string {
	if m := os.Getenv("COCKPITFS_MOUNT"); m != "" {
		return m
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/"
	}
	return filepath.Join(home, "cockpit")
}
