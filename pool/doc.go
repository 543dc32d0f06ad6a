// Package pool is the cluster-side inventory of node agents and their slots:
// placement (fit, image locality, spread), admission (a bounded FIFO fair
// across trainer jobs) and lease bookkeeping.
package pool
