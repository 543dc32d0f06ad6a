// Package pool is the cluster-side inventory of node agents and their slots:
// placement (fit, image locality, spread), admission (a bounded queue, fair
// first across namespaces by weight, then across the trainer jobs inside
// each) and lease bookkeeping.
package pool
