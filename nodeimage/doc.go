// Package nodeimage prepares task images on a worker node: one pull per image
// however many binds wait, unpack ahead, pre-pull lists, a disk budget with LRU
// garbage collection, the report of which images are ready (for placement),
// for private images, the registry's check of each pod's pull secrets
// before a cached image is handed to it, and the refusal of another
// namespace's snapshots (SnapshotRepositories).
package nodeimage
