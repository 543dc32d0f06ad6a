// Command sandman-node is the node agent: pre-warmed containerd slots on one worker.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	fs := flag.NewFlagSet("sandman-node", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: sandman-node [flags]\n\nsandman-node is the node agent: pre-warmed containerd slots on one worker.\nIt is not implemented yet.\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	fs.Usage()
	os.Exit(2)
}
