// Command sandman-daemon is the in-sandbox exec, process, session and file API (PID 1 of every sandbox).
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	fs := flag.NewFlagSet("sandman-daemon", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: sandman-daemon [flags]\n\nsandman-daemon is the in-sandbox exec, process, session and file API (PID 1 of every sandbox).\nIt is not implemented yet.\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	fs.Usage()
	os.Exit(2)
}
