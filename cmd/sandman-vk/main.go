// Command sandman-vk is the virtual-kubelet provider: one virtual node (shard) over many node agents.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	fs := flag.NewFlagSet("sandman-vk", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: sandman-vk [flags]\n\nsandman-vk is the virtual-kubelet provider: one virtual node (shard) over many node agents.\nIt is not implemented yet.\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	fs.Usage()
	os.Exit(2)
}
