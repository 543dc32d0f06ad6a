// Package soakreport holds the parts of the soak (e2e/soak_test.go, `make
// soak`) that need no stack: the fault log and which daemon calls it
// excuses, the order of faults, census differences, the comparison of each
// component's memory with its value after warm-up, double bindings and
// orphaned slots, the SVG line plots and the markdown report
// (docs/reliability.md). Keeping them here lets the unit tier test how a
// soak is judged.
package soakreport
