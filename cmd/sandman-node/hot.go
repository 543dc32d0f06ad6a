package main

import (
	"fmt"
	"strconv"
	"strings"
)

// hotBudget reads --hot-slots: a count of slots that may hold a started
// sandbox waiting for a pod (0: none), or "auto", as many as --warm-slots
// (the node keeps that many slots warm and as many hot, each for an image
// its binds use). Never more than the slots.
func hotBudget(spec string, slots, warm int) (int, error) {
	spec = strings.TrimSpace(spec)
	if spec == "auto" {
		return min(warm, slots), nil
	}
	n, err := strconv.Atoi(spec)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("--hot-slots %q: want auto, or a count of slots (0: no hot slots)", spec)
	}
	return min(n, slots), nil
}
