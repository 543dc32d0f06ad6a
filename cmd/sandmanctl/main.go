// Command sandmanctl is the trainer's and operator's command line.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	fs := flag.NewFlagSet("sandmanctl", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: sandmanctl [flags]\n\nsandmanctl is the trainer's and operator's command line.\nIt is not implemented yet.\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	fs.Usage()
	os.Exit(2)
}
