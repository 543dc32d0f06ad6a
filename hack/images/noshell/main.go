// Command noshell is the only program in the no-shell test image: it prints
// its arguments, or a greeting, so tests can tell it ran.
package main

import (
	"fmt"
	"os"
	"strings"
)

func main() {
	if len(os.Args) > 1 {
		fmt.Println(strings.Join(os.Args[1:], " "))
		return
	}
	fmt.Println("hello from an image without a shell")
}
