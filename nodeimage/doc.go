// Package nodeimage prepares task images on a worker node: one pull per image
// however many binds wait, unpack ahead, pre-pull lists, a disk budget with LRU
// garbage collection, and the report of which images are ready (for placement).
package nodeimage
